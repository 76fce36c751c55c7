"""gatekeeper in Apache Airflow (3.1 and newer): `GatekeeperSubmitOperator`, deferrable, and its trigger.

    from gatekeeper.airflow import GatekeeperSubmitOperator

    GatekeeperSubmitOperator(task_id="classify", input_path="/data/{{ ds }}/requests.jsonl",
                             results_path="s3://aws_default@bucket/{{ ds }}/results.jsonl", retries=2)

Installed with `pip install 'gatekeeper-batches[airflow]'`, registered as an Airflow provider (`get_provider_info`). This
package is the only place gatekeeper imports Airflow.
"""

from ._operator import GatekeeperSubmitOperator
from ._provider import get_provider_info
from ._trigger import GatekeeperTrigger

__all__ = ["GatekeeperSubmitOperator", "GatekeeperTrigger", "get_provider_info"]
