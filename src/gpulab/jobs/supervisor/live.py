"""Live pushes of a running job's rw/rwd volumes: every ``sync_interval`` seconds (the job's,
its flavor's or the site's) and when its owner asks ("push now").

The job's watch (``life.watch``) asks :meth:`LivePushes.consider` at each look; a push that is
due (:func:`gpulab.live_push.push_due`) runs in a task of its own, never in the watch (a push
may take minutes: the job's end, a hang or a time-out are seen meanwhile). One at a time per
job; the stop's push (``ending.finalize``, ``finish_preempt``) first waits for the one that
runs (:meth:`LivePushes.settle`), so it runs last and takes every file as it is then.

What a live push takes of each file is the sync engine's rule (:mod:`gpulab.datasync.live`:
settled files only, never one that changes while it is read, nothing deleted). Each push is
one event of the job (kind "sync": LIVE_PUSH with what it sent, or LIVE_PUSH_FAILED with its
error) and the record's ``live_push``; a failure changes no state and stops nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...data.sync import push_all
from ...live_push import push_due
from ..spec import JobSpec

if TYPE_CHECKING:
    from ..gang import Rank

log = logging.getLogger("gpulab.jobs")


def _ts(iso: str | None) -> float:
    """The epoch seconds of an API timestamp ("...Z"); 0 for none."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else 0.0


def pushable(spec: JobSpec) -> bool:
    """The job has a volume that pushes (rw, rwd): there is something to push live."""
    return any(v.pushes for v in spec.volumes)


@dataclass
class LivePushes:
    """The live pushes this supervisor runs: one task per job at most, and when each job's
    last one started (on the wall clock: a job's ``running_since`` is one). Its methods are
    handed the supervisor's ``JobContext`` (which holds this: not imported here)."""

    tasks: dict[str, asyncio.Task] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    def running(self, job_id: str) -> bool:
        task = self.tasks.get(job_id)
        return task is not None and not task.done()

    def consider(self, ctx: Any, job: dict, spec: JobSpec, gang: list[Rank]) -> None:
        """Start the job's live push when one is due (the job RUNNING, as its watch saw it)."""
        job_id = job["id"]
        interval = ctx.settings.sync_interval_for(spec.sync_interval, spec.flavor)
        due = push_due(
            time.time(),
            interval,
            _ts(job.get("running_since")),
            self.started.get(job_id),
            self.running(job_id),
            job.get("push_requested") is not None,
        )
        if due is None or not pushable(spec):
            return
        self.started[job_id] = time.time()
        self.tasks[job_id] = asyncio.get_running_loop().create_task(
            self._push(ctx, job_id, spec, gang[0].node, due), name=f"live-push-{job_id}"
        )

    async def _push(self, ctx: Any, job_id: str, spec: JobSpec, node: str, why: str):
        """One live push of every volume that pushes, on rank 0's node (its output is the
        job's, as at the stop); its outcome on the record and in the job's events."""
        try:
            await ctx.db(ctx.records.live_push_began, job_id, why)
            vols = ctx.volumes(job_id, spec, node)
            settle = ctx.settings.sync_settle
            outcomes = await push_all(ctx.data(job_id), vols, live=True, settle_s=settle)
            ok = all(o.ok for o in outcomes)
            files = sum(int(o.report.get("completed") or 0) for o in outcomes)
            sent = sum(int(o.report.get("bytes_transferred") or 0) for o in outcomes)
            said = "; ".join(o.summary() for o in outcomes)
            asked = "asked by its owner" if why == "request" else "every interval"
            message = (
                f"live push ({asked}): {said}" if ok else f"live push failed ({asked}): {said}"
            )
            await ctx.db(ctx.records.live_push_ended, job_id, ok, message[:2000], files, sent)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a live push is a courtesy: never a fault of the job
            log.warning("job %s: live push failed: %s", job_id, e)
            with contextlib.suppress(Exception):
                await ctx.db(
                    ctx.records.live_push_ended,
                    job_id,
                    False,
                    f"live push failed: {type(e).__name__}",
                    0,
                    0,
                )

    async def settle(self, job_id: str) -> None:
        """Wait for the job's live push, if one runs (before the stop's own push), and
        forget the job."""
        task = self.tasks.pop(job_id, None)
        self.started.pop(job_id, None)
        if task is not None and not task.done():
            log.info("job %s: waiting for its live push before the final one", job_id)
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def cancel_all(self) -> None:
        """This supervisor stops acting (its lease lost, a shutdown): the pushes it runs are
        cancelled (the next holder pushes again; a helper that runs on ends by itself)."""
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()
        self.started.clear()
