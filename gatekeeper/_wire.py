"""Facts of the API's wire that several modules need, with no imports of their own (the CLI reads them at start)."""

API_VERSION = "2023-06-01"  # the anthropic-version header, by default
STRICT_VERSION = "2026-10-21"  # refuses temperature, top_p, top_k, assistant documents, user citations (input/_schema)
API_VERSIONS = (API_VERSION, STRICT_VERSION)
API_VERSION_VARIABLE = "GATEKEEPER_API_VERSION"

# Per-batch limits (the Message Batches docs: 100,000 requests or 256 MB). 256 MB is read as 10^6 bytes: safe under
# either reading of "MB", at a cost of 4.6% against 2^20.
API_MAX_REQUESTS = 100_000
API_MAX_BYTES = 256_000_000
# A listing given both cursors: a page runs one way from one of them, so the API refuses the two (a 400
# invalid_request_error; its wording here is ours, unverified).
BOTH_CURSORS = "after_id, before_id: give one cursor at most, not both"

# The environment variables that hold workspace keys: the first as the SDKs name it, the second this tool's own.
API_KEY_VARIABLE = "ANTHROPIC_API_KEY"
EXTRA_KEYS_VARIABLE = "ANTHROPIC_EXTRA_WORKSPACE_KEYS"
# Any of these set may mean a credential (`api._credentials` reads them in the SDK's order); a profile on disk too.
CREDENTIAL_VARIABLES = (API_KEY_VARIABLE, EXTRA_KEYS_VARIABLE, "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE",
                        "ANTHROPIC_FEDERATION_RULE_ID", "ANTHROPIC_CONFIG_DIR")
# Where Claude Platform on AWS's credentials come from, as a refusal names them (the library's line and the CLI's
# setting alike: one text, so the CLI sees the line already says it and adds nothing).
AWS_CREDENTIALS_HINT = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, a role, or ANTHROPIC_AWS_API_KEY"
