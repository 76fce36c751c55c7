"""The pure decisions: admission, headroom verdicts, reconciliation, ownership, settling a result, downloads'
verdicts, the budget, a lease's end. Values in, values out: no I/O, no clock read."""
