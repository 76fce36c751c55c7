"""What Airflow's providers manager reads of gatekeeper (the `apache_airflow_provider` entry point)."""

from __future__ import annotations

from typing import Any

from .._version import __version__


def get_provider_info() -> dict[str, Any]:
    """The provider's description: its operator and trigger. The `anthropic` connection type is the Anthropic
    provider's; gatekeeper reads connections of that type and registers none of its own."""
    return {
        "package-name": "gatekeeper-batches",  # (the distribution; the import package is gatekeeper)
        "name": "gatekeeper",
        "description": "Very large Message Batches jobs through Anthropic's API: legal batches, admission against the "
                       "queue ceiling, exactly once, resumable on every retry.",
        "versions": [__version__],
        "operators": [{"integration-name": "gatekeeper", "python-modules": ["gatekeeper.airflow"]}],
        "triggers": [{"integration-name": "gatekeeper", "python-modules": ["gatekeeper.airflow"]}],
        "integrations": [{"integration-name": "gatekeeper", "external-doc-url": "https://github.com/", "tags": ["ai"]}],
    }
