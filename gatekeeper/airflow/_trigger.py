"""The trigger: the job's loop (admission, collection, resubmission) in the triggerer, until the job has ended.

The loop runs in a thread of its own with its own event loop, so neither the journal's and ledger's blocking calls
nor the reading of results ever holds the triggerer's event loop, which every other deferred task shares: the
trigger only awaits the thread's end. A trigger cancelled because the triggerer stops or hands the task to another
asks the loop to stop at its next safe point and leaves the job as it is (the next trigger continues it from the
journal); `on_kill`, called when a user kills the deferred task (Airflow 3.3 and newer), cancels the job's live
batches as `gatekeeper cancel` does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ..run._submit import STOP_GRACE
from ..run.realtime._realtime import CALLS_OUT_WAIT
from ._connection import api_config
from ._job import JobSpec, cancel_job, connection_config, failure, finished, run_job

# seconds a cancelled trigger waits for its loop: as long as a stop promises to take at most (a moment to reach a safe
# point, then the calls out, a create's or the real-time lane's, answered and committed), and a moment to hand back
STOP_WAIT = STOP_GRACE + CALLS_OUT_WAIT + 5.0


def _settle(done: asyncio.Future[dict[str, Any]], result: dict[str, Any]) -> None:
    if not done.done():
        done.set_result(result)


class GatekeeperTrigger(BaseTrigger):
    """Continue a gatekeeper job from its journal until every request is final, then fire once.

    :param spec: the job (`JobSpec` as a dict): connection id, input, state directory, journal, ledger, settings.
        It holds no key: the connection is read again here, by id.
    """

    def __init__(self, **spec: Any) -> None:
        super().__init__()
        self.spec = JobSpec(**spec)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "gatekeeper.airflow._trigger.GatekeeperTrigger", self.spec.to_kwargs()

    async def _config(self) -> Any:
        """The connection, read by id here: the async lookup, and, where it cannot find a connection that exists (one
        made with `airflow connections add`, under `airflow dags test` on Airflow 3.3), the synchronous lookup in a
        thread (never on the triggerer's loop)."""
        from airflow.providers.common.compat.connection import get_async_connection, get_async_extra_dejson

        try:
            conn = await get_async_connection(self.spec.conn_id)
            return api_config(self.spec.conn_id, conn.password, conn.host, await get_async_extra_dejson(conn),
                              login=conn.login, conn_type=conn.conn_type)
        except Exception as first:  # (AirflowNotFoundException, or a lookup this Airflow cannot do asynchronously)
            try:
                return await asyncio.to_thread(connection_config, self.spec.conn_id)
            except Exception:
                raise first from None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Run the loop in its thread; yield one event: "success" with the small summary, or "error"."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[dict[str, Any]] = loop.create_future()
        stop = threading.Event()
        try:
            config = await self._config()
        except Exception as exc:  # (a missing connection or key: the task fails with its message)
            yield TriggerEvent(failure(exc))
            return

        def work() -> None:
            try:
                spec = self.spec.here()  # (its folder by this triggerer's own configuration)
                if spec.table is not None:
                    from ._table import render_again

                    render_again(spec)
                summary = run_job(spec.for_run(), config, stop=stop, continue_only=True)  # (only `execute` starts a job)
                result = {"status": "success", "summary": finished(spec, summary)}
            except BaseException as exc:  # every outcome goes back to the loop as an event
                result = failure(exc)
            loop.call_soon_threadsafe(_settle, done, result)

        thread = threading.Thread(target=work, name=f"gatekeeper-{self.spec.state_dir}", daemon=True)
        thread.start()
        try:
            event = await asyncio.shield(done)
        except asyncio.CancelledError:
            stop.set()  # the triggerer stops or moves the task: leave the job resumable, cancel nothing
            await asyncio.to_thread(thread.join, STOP_WAIT)
            raise
        yield TriggerEvent(event)

    async def on_kill(self) -> None:
        """The deferred task was killed: cancel the job's live batches, recorded in its journal."""
        config = await self._config()
        count = await asyncio.to_thread(cancel_job, self.spec.here().for_run(), config)
        self.log.info("gatekeeper: %d live batch(es) of the job canceled", count)
