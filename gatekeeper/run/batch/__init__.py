"""The batch lane: admission against live headroom, the creates, collection of what ended, priming again, the shared ledger's turns."""
