"""Live pushes of running notebooks: their workspace, home and writable volumes pushed while
they run, every ``sync_interval`` (the flavor's, else the site's) and when their owner asks
("push now": the API, the home page).

The service runs them (:class:`NotebookLivePushes`, one per service process: its periodic
look, ``service/tasks/live_push.py``, while it leads; an owner's request at once), through
the same sync helper as a stop's push, next to the notebook's volumes. One at a time per
notebook (in this process, and across processes through the record's ``push_requested`` and
``live_push``). A live push starts only while the record says RUNNING; the hub's stop sets
STOPPING first, and its push waits for a live push still holding the volume's lock (the
helper's ``--wait-lock``), so the stop's push runs last and takes every file as it is.

What a live push takes of each file is the sync engine's rule (:mod:`gpulab.datasync.live`:
settled files only, never one that changes while it is read, nothing deleted). Each push is
one event in the notebook's history (LIVE_PUSH with what it sent per volume, or
LIVE_PUSH_FAILED with its error) and the record's ``live_push``; it never changes its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..data.sync import push_all
from ..lifecycle import InvalidTransition, NotebookState
from ..live_push import iso_seconds, push_due
from ..names import notebook_workload_id
from ..runtime.base import Runtime
from .data import NotebookData
from .life import NotebookRefused, push_again
from .records import NotebookRecords

log = logging.getLogger("gpulab.notebooks")
S = NotebookState


@dataclass
class NotebookLivePushes:
    """The live pushes this service runs: one task per notebook at most, and when each one's
    last started (wall clock)."""

    settings: Any  # GpulabSettings
    runtime: Runtime
    records: NotebookRecords
    tasks: dict[tuple[str, str], asyncio.Task] = field(default_factory=dict)
    started: dict[tuple[str, str], float] = field(default_factory=dict)

    def running(self, key: tuple[str, str]) -> bool:
        task = self.tasks.get(key)
        return task is not None and not task.done()

    def interval_of(self, nb: dict) -> float:
        """Seconds between its live pushes: its flavor's sync_interval, else the site's."""
        return self.settings.sync_interval_for(None, (nb.get("options") or {}).get("flavor"))

    async def look(self) -> int:
        """One periodic look: start the live push of every RUNNING notebook whose interval
        has passed since its start or its last one; how many were started."""
        started = 0
        now = time.time()
        for nb in await asyncio.to_thread(self.records.running):
            key = (nb["user"], nb["server"])
            due = push_due(
                now,
                self.interval_of(nb),
                iso_seconds(nb.get("running_since")) or now,
                self.started.get(key),
                self.running(key),
                False,
            )
            if due is not None:
                self._start(key, "interval")
                started += 1
        self._forget_ended()
        return started

    async def push(self, record: dict, by: str) -> tuple[int, dict]:
        """An owner's push of the notebook whose record is ``record``: a RUNNING one's live
        push starts now (202, the record); a SYNC_FAILED one's push is retried as before
        (200 and the record, or 502 when it failed again). NotebookRefused (409) otherwise,
        and while one is asked or runs (NotebookRefused)."""
        user, server = record["user"], record["server"]
        if record["state"] == S.SYNC_FAILED.value:  # the one push retry, as before
            ok, after = await push_again(self.settings, self.runtime, self.records, record, by)
            return (200 if ok else 502), after
        if record["state"] != S.RUNNING.value:
            raise NotebookRefused(
                409,
                "a notebook's push runs now only while it is RUNNING, and only a SYNC_FAILED "
                f"notebook's push can be retried; this one is {record['state']}",
            )
        key = (user, server)
        if self.running(key):
            raise NotebookRefused(409, "a push of this notebook is already under way")
        try:
            asked, fresh = await asyncio.to_thread(self.records.request_push, user, server)
        except KeyError:
            raise NotebookRefused(404, "no such notebook") from None
        except InvalidTransition:
            raise NotebookRefused(409, "this notebook is no longer RUNNING") from None
        if not fresh:
            raise NotebookRefused(409, "a push of this notebook is already under way")
        self._start(key, "request")
        return 202, asked

    def _start(self, key: tuple[str, str], why: str) -> None:
        self.started[key] = time.time()
        self.tasks[key] = asyncio.get_running_loop().create_task(
            self._push(key, why), name=f"live-push-{key[0]}-{key[1]}"
        )

    async def _push(self, key: tuple[str, str], why: str) -> None:
        """One live push of every volume of the notebook that pushes (its workspace, its home,
        its rw/rwd volumes), where its record says it runs."""
        user, server = key
        try:
            nb = await asyncio.to_thread(self.records.live_push_began, user, server, why)
            if nb is None:
                return  # no longer RUNNING: its stop's push takes everything
            workload = notebook_workload_id(self.settings.instance, user, server)
            data = NotebookData.of_record(self.settings, self.runtime, nb, workload)
            outcomes = await push_all(
                data.sync, data.volumes, live=True, settle_s=self.settings.sync_settle
            )
            ok = all(o.ok for o in outcomes)
            files = sum(int(o.report.get("completed") or 0) for o in outcomes)
            sent = sum(int(o.report.get("bytes_transferred") or 0) for o in outcomes)
            said = "; ".join(o.summary() for o in outcomes) or "nothing that pushes"
            asked = "asked by its owner" if why == "request" else "every interval"
            message = (
                f"live push ({asked}): {said}" if ok else f"live push failed ({asked}): {said}"
            )
            await asyncio.to_thread(
                self.records.live_push_ended, user, server, ok, message[:2000], files, sent
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a live push is a courtesy: never a fault of the notebook
            log.warning("notebook %s/%s: live push failed: %s", user, server, e)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.records.live_push_ended,
                    user,
                    server,
                    False,
                    f"live push failed: {type(e).__name__}",
                    0,
                    0,
                )

    def _forget_ended(self) -> None:
        for key in [k for k, t in self.tasks.items() if t.done()]:
            del self.tasks[key]
        if len(self.started) > 10_000:
            self.started.clear()

    async def close(self) -> None:
        """Cancel the pushes under way (a shutdown; tests)."""
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
