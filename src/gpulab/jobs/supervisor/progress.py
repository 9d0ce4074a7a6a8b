"""Live progress of a job's data transfers (pulls at INITIALIZING, pushes at FINALIZING), as
notebooks show theirs: the job's message follows the sync helper's progress lines (at most
one write a second, and only while the job is still in that state), and each volume's start
and end is an event of the job's history."""

from __future__ import annotations

import asyncio
import time

from ...data.sync import SyncOutcome, VolumeSync, progress_message
from ...lifecycle import JobState

#: seconds between two writes of a job's progress message
EVERY = 1.0


class TransferNotes:
    """Report one volume's transfer of one job (``verb``: "pulling" or "pushing")."""

    def __init__(self, ctx, job_id: str, state: JobState, verb: str, vol: VolumeSync):
        self.ctx, self.job_id, self.state, self.verb, self.vol = (
            ctx,
            job_id,
            state,
            verb,
            vol,
        )
        self._last = 0.0
        self._writing: asyncio.Task | None = None

    async def begin(self) -> None:
        await self.ctx.db(
            self.ctx.records.note, self.job_id, "progress", "SYNC", f"{self.verb} {self.vol.label}"
        )

    def on_progress(self, p: dict) -> None:
        """The helper's progress line (on the event loop): the message, at most each second."""
        now = time.monotonic()
        if now - self._last < EVERY or (self._writing and not self._writing.done()):
            return
        self._last = now
        text = progress_message(self.verb, self.vol.label, p)
        self._writing = asyncio.get_running_loop().create_task(
            self.ctx.db(self.ctx.records.set_progress, self.job_id, self.state, text)
        )

    async def end(self, outcome: SyncOutcome) -> None:
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        done = "pulled" if self.verb == "pulling" else "pushed"
        text = (
            f"{done} {outcome.summary()}"
            if outcome.ok
            else outcome.reason  # refused by the disk quota: the sentence names the volume
            if outcome.refused
            else f"{self.verb} failed: " + (outcome.summary())
        )
        await self.ctx.db(self.ctx.records.note, self.job_id, "progress", "SYNC", text)


async def push_with_notes(
    ctx, job_id: str, state: JobState, volumes: list[VolumeSync]
) -> list[SyncOutcome]:
    """Push every volume that pushes (rw, rwd; ro volumes never are), with live progress."""
    outcomes = []
    for vol in volumes:
        if not vol.spec.pushes:
            continue
        notes = TransferNotes(ctx, job_id, state, "pushing", vol)
        await notes.begin()
        outcomes.append(await ctx.data(job_id).run("push", vol, notes.on_progress))
        await notes.end(outcomes[-1])
    return outcomes
