"""Reading and sizing the input: validate every line in one pass, find duplicates, cut legal batches."""
