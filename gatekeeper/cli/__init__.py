"""The command line: parsing, wiring, printing."""
