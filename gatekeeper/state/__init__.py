"""The durable state: the journal (all of its SQL), the shared ledger, the results file, the database layer."""
