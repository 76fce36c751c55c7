"""An Airflow Dag that sends a night's requests through gatekeeper (Airflow 3.1+, `pip install 'gatekeeper-batches[airflow]'`).

Put it in your dags folder. It needs an `anthropic` connection named `anthropic_default`: password the workspace key,
extra `{"admin_key": "..."}` so the queue's ceiling can be read. For example, with the Airflow CLI (the connection
type is `anthropic` with Airflow's Anthropic provider installed; without it, Airflow records it as `generic`, which
gatekeeper reads the same way):

    airflow connections add anthropic_default --conn-type anthropic --conn-password YOUR_WORKSPACE_KEY \
        --conn-extra '{"admin_key": "YOUR_ADMIN_KEY"}'

or as an environment variable:

    export AIRFLOW_CONN_ANTHROPIC_DEFAULT='{"conn_type": "anthropic", "password": "YOUR_WORKSPACE_KEY",
                                           "extra": {"admin_key": "YOUR_ADMIN_KEY"}}'

It runs on its schedule and on a manual trigger alike: the day in the paths is the run's logical date, or, for a
manual run (which has none), the day it was triggered.

The task plans the file on a worker, then defers: the triggerer runs the job to its end, holding no worker slot.
Retries are safe: every retry, cleared task or second run over the same file continues the same job.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import DAG

from gatekeeper.airflow import GatekeeperSubmitOperator

DATA = os.environ.get("GATEKEEPER_EXAMPLE_DATA", "/data")  # where the pipeline writes requests and reads results
DAY = "{{ (logical_date or dag_run.run_after) | ds }}"  # (a manual run has no logical date: `ds` is undefined there)

with DAG("nightly_classification", schedule="@daily", catchup=False, tags=["gatekeeper"]) as dag:
    GatekeeperSubmitOperator(
        task_id="classify",
        input_path=f"{DATA}/requests/{DAY}.jsonl",  # written by the task before, one request a line
        results_path=f"{DATA}/results/{DAY}.jsonl",  # or an object-storage URL: f"s3://aws_default@bucket/{DAY}.jsonl"
        conn_id="anthropic_default",
        retries=3,
        retry_delay=timedelta(minutes=5),
        poll_interval=60,
        # Several workers and triggerers: keep the journal (and a shared ledger) in PostgreSQL.
        # journal="gatekeeper_postgres",  # an Airflow Postgres connection id, or a postgresql:// URL
    )
