"""The admission ledger shared by submitters: one module a backend (in-process, SQLite, PostgreSQL, Redis),
the protocol and the admission formula in `_base`, `open_ledger` in `_open`."""
