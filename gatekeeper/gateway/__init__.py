"""`gatekeeper serve`: a gateway that speaks the Message Batches API, so that any client that takes a base URL (the
SDKs, an orchestrator's operator, an agent framework) gets gatekeeper's guarantees for its batches: each create a
job, of any size, created once however often it is retried (docs/gateway.md).

Its modules are private, in the order a create flows through them: `_stream` and `_create` (a create received,
judged, recorded), `_keys` (who calls), `_wire` (the API's shapes), `_job` (a batch's job) and `_runner`
(which replica runs which job), `_proxy`, `_routes`, `_metrics`, `_logs`, `_settings`, `_server`. Installed with the `gateway` extra
(Starlette, uvicorn, msgspec, prometheus_client); this package itself imports without it.
"""
