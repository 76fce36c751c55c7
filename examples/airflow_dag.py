"""An Airflow Dag that sends a night's requests through gatekeeper (Airflow 3.1+, `pip install 'gatekeeper-batches[airflow]'`).

Put it in your dags folder. It needs an `anthropic` connection named `anthropic_default`: password the workspace key,
extra `{"admin_key": "..."}` so the queue's ceiling can be read. For example, as an environment variable:

    export AIRFLOW_CONN_ANTHROPIC_DEFAULT='{"conn_type": "anthropic", "password": "YOUR_WORKSPACE_KEY",
                                           "extra": {"admin_key": "YOUR_ADMIN_KEY"}}'

The task plans the file on a worker, then defers: the triggerer runs the job to its end, holding no worker slot.
Retries are safe: every retry, cleared task or second run over the same file continues the same job.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG

from gatekeeper.airflow import GatekeeperSubmitOperator

with DAG("nightly_classification", schedule="@daily", catchup=False, tags=["gatekeeper"]) as dag:
    GatekeeperSubmitOperator(
        task_id="classify",
        input_path="/data/requests/{{ ds }}.jsonl",  # written by the task before, one request a line
        results_path="/data/results/{{ ds }}.jsonl",  # or an object-storage URL: "s3://aws_default@bucket/{{ ds }}.jsonl"
        conn_id="anthropic_default",
        retries=3,
        retry_delay=timedelta(minutes=5),
        poll_interval=60,
        # Several workers and triggerers: keep the journal (and a shared ledger) in PostgreSQL.
        # journal="gatekeeper_postgres",  # an Airflow Postgres connection id, or a postgresql:// URL
    )
