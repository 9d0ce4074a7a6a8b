"""How a job's run ends: stopped by request, lost with its node, preempted, finalized (logs,
data pushed, GPUs released once the engine confirms the containers are gone). Functions
handed a :class:`~.context.JobContext`."""

from __future__ import annotations

import contextlib

from ...data.sync import push_verdict
from ...faults import fault_point
from ...lifecycle import JobState
from ..gang import Rank
from ..records import RequestChanged
from ..recovery import path
from ..spec import JobSpec
from ..spec.ports import job_path
from .context import JobContext
from .engine import gang_stopped, release_network, remove_gang, save_logs
from .progress import push_with_notes

J = JobState
#: the states a job's task carries on from after a fault or a restart of the service
RECOVERABLE = frozenset(
    {J.INITIALIZING, J.PENDING, J.RUNNING, J.RESTARTING, J.INTERRUPTING, J.TIMEOUT, J.FINALIZING}
)


# --- stopping ------------------------------------------------------------------------


async def stop_by_request(
    ctx: JobContext, job_id: str, job: dict, spec: JobSpec, gang: list[Rank]
) -> None:
    grace = ctx.settings.preemption_grace
    state = JobState(job["state"])
    if job["request"] == "preempt":
        if state is not J.INTERRUPTING:
            await ctx.move(
                job_id,
                J.INTERRUPTING,
                expect=state,
                reason="PREEMPTED",
                message=f"its GPUs are needed by in-quota work: SIGTERM, {grace:g} s to checkpoint",
            )
        return await finish_preempt(ctx, job_id, spec, gang)
    if state is not J.INTERRUPTING:
        await ctx.move(
            job_id,
            J.INTERRUPTING,
            expect=state,
            reason="USER_INTERRUPT",
            message=f"SIGTERM sent, {grace:g} s grace",
        )
    why = "TIMEOUT" if job["reason"] == "TIMEOUT" else "USER_INTERRUPT"
    await finalize(ctx, job_id, J.INTERRUPTED, why, "interrupted by its owner")


async def lost(
    ctx: JobContext, job_id: str, job: dict, spec: JobSpec, gang: list[Rank], error: str
) -> None:
    """The engine lost the workload without an exit code: its node went down or was
    drained (Swarm). Its volumes went with the node. Recorded INTERRUPTING (NODE_LOST),
    then :meth:`finish_lost` removes every worker and re-queues the job (or fails it)."""
    state = JobState(job["state"])
    why = f"its node was lost ({error})" if error else "its node was lost"
    # INTERRUPTING (NODE_LOST) first: a crash while the workers are removed is carried on
    # from there by recovery (Step.FINISH_LOST), not taken for a lost container (ERROR)
    await ctx.move(job_id, J.INTERRUPTING, expect=state, reason="NODE_LOST", message=why)
    await finish_lost(ctx, job_id, job, spec, gang, why)


async def finish_lost(
    ctx: JobContext, job_id: str, job: dict, spec: JobSpec, gang: list[Rank], why: str
) -> None:
    """INTERRUPTING for a lost node: remove every worker (the job restarts whole,
    elsewhere), release the GPUs once the engine confirms they are gone, then back to the
    queue while it has restarts left, else FAILED (NODE_LOST). An interrupt meanwhile
    wins: INTERRUPTED. Nothing is pushed: the node's copy of the volumes went with it."""
    await remove_gang(ctx, gang)
    fault_point("engine:lost-removed")
    await gang_stopped(ctx, gang, 0)
    await release_network(ctx, job_id, len(gang))
    await ctx.db(ctx.ledger.release, ctx.workload(job_id))
    owner_says = (J.INTERRUPTED, "USER_INTERRUPT", "interrupted by its owner")
    if job["restarts"] >= spec.retries:
        if await ctx.requested(job_id) == "interrupt":
            return await finalize(ctx, job_id, *owner_says, push=False)
        return await finalize(ctx, job_id, J.FAILED, "NODE_LOST", why, push=False)
    n = job["restarts"] + 1
    again = f"queued again to run on another node: {why}; restart {n} of {spec.retries}"
    try:
        await ctx.move(
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
        await finalize(ctx, job_id, *owner_says, push=False)


async def finish_preempt(ctx: JobContext, job_id: str, spec: JobSpec, gang: list[Rank]) -> None:
    """INTERRUPTING for a preemption: stop, push, remove the container, release the
    GPUs, then back to the queue, unless an interrupt came meanwhile: then the job ends
    INTERRUPTED (the user's word wins over the scheduler's). A job submitted with
    ``terminate_after_preemption`` is never re-queued: it ends INTERRUPTED (PREEMPTED)
    through :func:`finalize` (stopped after its grace, output pushed, GPUs released once
    the engine confirms the container stopped), as an interrupted job does."""
    if spec.terminate_after_preemption:
        if await ctx.requested(job_id) == "interrupt":
            return await finalize(
                ctx, job_id, J.INTERRUPTED, "USER_INTERRUPT", "interrupted by its owner"
            )
        return await finalize(
            ctx,
            job_id,
            J.INTERRUPTED,
            "PREEMPTED",
            "preempted for in-quota work; not re-queued (terminate_after_preemption)",
        )
    await gang_stopped(ctx, gang, ctx.settings.preemption_grace)
    await save_logs(ctx, job_id, gang)
    await ctx.live.settle(job_id)  # a live push still running ends first: this one is last
    vols = ctx.volumes(job_id, spec, gang[0].node)  # rank 0's node holds the output
    ok, message = push_verdict(await push_with_notes(ctx, job_id, J.INTERRUPTING, vols))
    fault_point("engine:push")
    await remove_gang(ctx, gang)
    await gang_stopped(ctx, gang, 0)
    await release_network(ctx, job_id, len(gang))
    await ctx.db(ctx.ledger.release, ctx.workload(job_id))
    try:
        await ctx.move(
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
        await finalize(ctx, job_id, J.INTERRUPTED, "USER_INTERRUPT", "interrupted by its owner")


async def finalize(
    ctx: JobContext,
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
    job = await ctx.db(ctx.records.get, job_id, False)
    if job is None:
        return
    state = JobState(job["state"])
    if state not in RECOVERABLE:
        return  # ended already
    gang = ctx.gang(job_id, job)
    await gang_stopped(ctx, gang, ctx.settings.preemption_grace)
    for port in JobSpec.from_json(job["spec"]).ports:  # a Swarm gateway's routes
        with contextlib.suppress(Exception):
            await ctx.runtime.unreach(f"{job_path(job_id)}/ports/{port.name}/")
    steps = path(state, outcome, push)
    if steps[0] is J.FINALIZING and state is not J.FINALIZING:
        job = await ctx.move(
            job_id,
            J.FINALIZING,
            expect=state,
            reason=reason,
            message=message,
            exit_code=exit_code,
            outcome=outcome.value,
        )
        state = J.FINALIZING
    await ctx.db(ctx.ledger.release, ctx.workload(job_id))
    await save_logs(ctx, job_id, gang)
    await release_network(ctx, job_id, len(gang))
    await ctx.live.settle(job_id)  # a live push still running ends first: this one is last
    extra = ""
    if state is J.FINALIZING:
        spec = JobSpec.from_json(job["spec"])
        vols = ctx.volumes(job_id, spec, gang[0].node)  # rank 0's output is the job's
        ok, pushed = push_verdict(await push_with_notes(ctx, job_id, J.FINALIZING, vols))
        fault_point("engine:push")
        if not ok:
            await ctx.move(
                job_id,
                J.SYNC_FAILED,
                expect=J.FINALIZING,
                reason="PUSH_FAILED",
                message=pushed,
                outcome=outcome.value,
            )
            return
        extra = f"; {pushed}" if pushed and pushed != "compute released" else ""
    await ctx.move(
        job_id,
        outcome,
        expect=state,
        reason=reason,
        message=message + extra,
        exit_code=exit_code,
        devices="",
    )
    ctx.fault_streak.pop(job_id, None)
