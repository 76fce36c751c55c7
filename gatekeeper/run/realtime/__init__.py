"""The real-time lane: the deadline's moves out of the batch lane, and the Messages calls paced on the rate-limit headers."""
