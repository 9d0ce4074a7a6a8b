"""How a job's run ends: stopped by request, lost with its node, preempted, finalized (logs,
data pushed, GPUs released once the engine confirms the containers are gone), and a failed
push retried. A mixin of :class:`~gpulab.jobs.runner.JobLife` (the supervisor's job life)."""

from __future__ import annotations

import asyncio
import contextlib

from ..data.sync import push_verdict
from ..faults import fault_point
from ..lifecycle import JobState
from .gang import Rank
from .progress import push_with_notes
from .records import RequestChanged
from .recovery import path
from .spec import JobSpec
from .spec.ports import job_path

J = JobState
#: the states a job's task carries on from after a fault or a restart of the service
RECOVERABLE = frozenset(
    {J.INITIALIZING, J.PENDING, J.RUNNING, J.RESTARTING, J.INTERRUPTING, J.TIMEOUT, J.FINALIZING}
)


class JobEnding:
    """Mixin of :class:`~gpulab.jobs.runner.JobLife`: how a job's run ends."""

    # --- stopping ------------------------------------------------------------------------

    async def _stop_by_request(
        self, job_id: str, job: dict, spec: JobSpec, gang: list[Rank]
    ) -> None:
        grace = self.s.preemption_grace
        state = JobState(job["state"])
        if job["request"] == "preempt":
            if state is not J.INTERRUPTING:
                await self.move(
                    job_id,
                    J.INTERRUPTING,
                    expect=state,
                    reason="PREEMPTED",
                    message=f"its GPUs are needed by in-quota work: SIGTERM, {grace:g} s "
                    "to checkpoint",
                )
            return await self.finish_preempt(job_id, spec, gang)
        if state is not J.INTERRUPTING:
            await self.move(
                job_id,
                J.INTERRUPTING,
                expect=state,
                reason="USER_INTERRUPT",
                message=f"SIGTERM sent, {grace:g} s grace",
            )
        why = "TIMEOUT" if job["reason"] == "TIMEOUT" else "USER_INTERRUPT"
        await self.finalize(job_id, J.INTERRUPTED, why, "interrupted by its owner")

    async def lost(
        self, job_id: str, job: dict, spec: JobSpec, gang: list[Rank], error: str
    ) -> None:
        """The engine lost the workload without an exit code: its node went down or was
        drained (Swarm). Its volumes went with the node. Recorded INTERRUPTING (NODE_LOST),
        then :meth:`finish_lost` removes every worker and re-queues the job (or fails it)."""
        state = JobState(job["state"])
        why = f"its node was lost ({error})" if error else "its node was lost"
        # INTERRUPTING (NODE_LOST) first: a crash while the workers are removed is carried on
        # from there by recovery (Step.FINISH_LOST), not taken for a lost container (ERROR)
        await self.move(job_id, J.INTERRUPTING, expect=state, reason="NODE_LOST", message=why)
        await self.finish_lost(job_id, job, spec, gang, why)

    async def finish_lost(
        self, job_id: str, job: dict, spec: JobSpec, gang: list[Rank], why: str
    ) -> None:
        """INTERRUPTING for a lost node: remove every worker (the job restarts whole,
        elsewhere), release the GPUs once the engine confirms they are gone, then back to the
        queue while it has restarts left, else FAILED (NODE_LOST). An interrupt meanwhile
        wins: INTERRUPTED. Nothing is pushed: the node's copy of the volumes went with it."""
        await self.remove_gang(gang)
        fault_point("engine:lost-removed")
        await self.gang_stopped(gang, 0)
        await self.release_network(job_id, gang)
        await self.db(self.ledger.release, self.workload(job_id))
        owner_says = (J.INTERRUPTED, "USER_INTERRUPT", "interrupted by its owner")
        if job["restarts"] >= spec.retries:
            if await self._requested(job_id) == "interrupt":
                return await self.finalize(job_id, *owner_says, push=False)
            return await self.finalize(job_id, J.FAILED, "NODE_LOST", why, push=False)
        n = job["restarts"] + 1
        again = f"queued again to run on another node: {why}; restart {n} of {spec.retries}"
        try:
            await self.move(
                job_id,
                J.QUEUED,
                expect=J.INTERRUPTING,
                expect_request=frozenset({"", "preempt"}),  # a preemption is moot now
                reason="NODE_LOST",
                message=again,
                devices="",
                over_quota=0,
                container="",
                restarts=n,
            )
        except RequestChanged:  # the owner's interrupt came meanwhile: it wins
            await self.finalize(job_id, *owner_says, push=False)

    async def finish_preempt(self, job_id: str, spec: JobSpec, gang: list[Rank]) -> None:
        """INTERRUPTING for a preemption: stop, push, remove the container, release the
        GPUs, then back to the queue, unless an interrupt came meanwhile: then the job ends
        INTERRUPTED (the user's word wins over the scheduler's)."""
        await self.gang_stopped(gang, self.s.preemption_grace)
        await self.save_logs(job_id, gang)
        vols = self.volumes(job_id, spec, gang[0].node)  # rank 0's node holds the output
        ok, message = push_verdict(await push_with_notes(self, job_id, J.INTERRUPTING, vols))
        fault_point("engine:push")
        await self.remove_gang(gang)
        await self.gang_stopped(gang, 0)
        await self.release_network(job_id, gang)
        await self.db(self.ledger.release, self.workload(job_id))
        try:
            await self.move(
                job_id,
                J.QUEUED,
                expect=J.INTERRUPTING,
                expect_request=frozenset({"preempt"}),
                reason="PREEMPTED",
                message="re-queued after preemption; " + message,
                devices="",
                over_quota=0,
                container="",
            )
        except RequestChanged:
            await self.finalize(job_id, J.INTERRUPTED, "USER_INTERRUPT", "interrupted by its owner")

    async def finalize(
        self,
        job_id: str,
        outcome: JobState,
        reason: str,
        message: str,
        exit_code: int | None = None,
        push: bool = True,
    ) -> None:
        """Stop (confirmed by the engine), release the GPUs, keep the logs, push the output
        (through FINALIZING, where the lifecycle has it), then the outcome. Safe to run again
        after a crash at any line: each step is idempotent and each move a compare-and-set."""
        job = await self.db(self.records.get, job_id, False)
        if job is None:
            return
        state = JobState(job["state"])
        if state not in RECOVERABLE:
            return  # ended already
        gang = self.gang(job_id, job)
        await self.gang_stopped(gang, self.s.preemption_grace)
        for port in JobSpec.from_json(job["spec"]).ports:  # a Swarm gateway's routes
            with contextlib.suppress(Exception):
                await self.runtime.unreach(f"{job_path(job_id)}/ports/{port.name}/")
        steps = path(state, outcome, push)
        if steps[0] is J.FINALIZING and state is not J.FINALIZING:
            job = await self.move(
                job_id,
                J.FINALIZING,
                expect=state,
                reason=reason,
                message=message,
                exit_code=exit_code,
                outcome=outcome.value,
            )
            state = J.FINALIZING
        await self.db(self.ledger.release, self.workload(job_id))
        await self.save_logs(job_id, gang)
        await self.release_network(job_id, gang)
        extra = ""
        if state is J.FINALIZING:
            spec = JobSpec.from_json(job["spec"])
            vols = self.volumes(job_id, spec, gang[0].node)  # rank 0's output is the job's
            ok, pushed = push_verdict(await push_with_notes(self, job_id, J.FINALIZING, vols))
            fault_point("engine:push")
            if not ok:
                await self.move(
                    job_id,
                    J.SYNC_FAILED,
                    expect=J.FINALIZING,
                    reason="PUSH_FAILED",
                    message=pushed,
                    outcome=outcome.value,
                )
                return
            extra = f"; {pushed}" if pushed and pushed != "compute released" else ""
        await self.move(
            job_id,
            outcome,
            expect=state,
            reason=reason,
            message=message + extra,
            exit_code=exit_code,
            devices="",
        )
        self.fault_streak.pop(job_id, None)

    async def retry_push(self, job_id: str) -> dict:
        """SYNC_FAILED → FINALIZING (a compare-and-set), then the push runs in the job's own
        supervised task, like any finalization: a fault or a restart carries it on. The
        leader waits for it and answers with the outcome (or SYNC_FAILED again); a service
        in standby answers FINALIZING, and the leader adopts the job within seconds."""
        job = await self.db(self.records.get, job_id, False)
        if job is None:
            raise KeyError(job_id)
        outcome = JobState(job.get("outcome") or J.DONE.value)
        await self.move(
            job_id,
            J.FINALIZING,
            expect=J.SYNC_FAILED,
            reason="PUSH_RETRY",
            message="push retried",
            outcome=outcome.value,
        )
        self.spawn_task(job_id, attach=True)
        task = self.tasks.get(job_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        else:
            self.wake.set()
        return await self.db(self.records.get, job_id)
