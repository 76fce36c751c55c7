"""Recovery: settling creates whose outcome is unknown, the evidence of whose a batch is, and the output rebuilt from the API."""
