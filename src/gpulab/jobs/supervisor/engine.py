"""What a job's life asks of the engine, through the ``Runtime`` only: one ``WorkloadSpec``
per rank, created and started; stopped (confirmed), restarted in place, removed; the tail of
its log kept.

Functions handed a :class:`~.context.JobContext`. Every call that changes something is
followed by a fault-injection point (``engine:NAME``, see :mod:`gpulab.faults`).
"""

from __future__ import annotations

import asyncio
import logging

from ...faults import fault_point
from ...gpus.inventory import device_id
from ...names import rank_alias, rank_name, workload_labels
from ...resources import container_limits
from ...runtime.base import EngineError, Mount, StillRunning, WorkloadGone, WorkloadSpec
from ..gang import Rank, distributed_env
from ..logs import LOG_KEEP_BYTES, merge_logs, rank_log_share, read_tail
from ..spec import JobSpec
from ..spec.array import task_env
from ..spec.ports import job_path, port_env
from .context import JobContext
from .git_sources import git_mounts

log = logging.getLogger("gpulab.jobs.containers")


def workload_spec(
    ctx: JobContext,
    job_id,
    spec: JobSpec,
    name,
    devices,
    owner,
    node,
    secrets=None,
    rank: int = 0,
    image: str = "",
    cached: dict[tuple[str, str], str] | None = None,
) -> WorkloadSpec:
    """What the engine is asked to run for this job (any backend). ``secrets``: the values
    of ``spec.secret_env`` (variable -> value), revealed for this container only. ``name``
    is rank 0's: its volumes and checkouts are every rank's (each node has its own copy).
    ``image``: the reference to run (an image from a registry pinned to its digest; ""
    the spec's image as the engine names it). ``cached``: {(volume spec, node): the dataset
    cache's volume} that a read-only volume is mounted from instead of the job's own.
    """
    s = ctx.settings
    distributed = spec.workers > 1
    limits = container_limits(spec.resources, s.pids_limit, s.shm_fraction)
    env = {
        **spec.env,
        **(secrets or {}),
        **port_env(spec.ports, job_path(job_id)),
        "GPULAB_JOB_ID": job_id,
        "GPULAB_JOB_NAME": spec.name,
        **(distributed_env(rank, spec.workers) if distributed else {}),
        # a task of an array: its index and parameters (GPULAB_ names: none set by the user)
        **(task_env(spec.task, spec.completions or 1) if spec.task is not None else {}),
    }
    return WorkloadSpec(
        name=rank_name(name, rank),
        image=image or ctx.runtime.image_ref(spec.image),
        command=[*spec.command, *spec.args],
        env=env,
        labels={
            **spec.labels,
            **workload_labels(s.instance, "job", owner, ctx.workload(job_id), devices),
            "org.gpulab.job": job_id,
            **({"org.gpulab.rank": str(rank)} if distributed else {}),
        },
        user="1000:100",
        cpus=spec.resources.cpus,
        memory=limits.mem_limit,
        pids_limit=limits.pids_limit,
        shm_size=limits.shm_size,
        gpu_ids=[device_id(d) for d in devices],
        mounts=[
            *(
                Mount(
                    (cached or {}).get((str(v.spec), node), v.docker_volume),
                    v.spec.mount,
                    read_only=v.spec.mode == "ro",
                    no_copy=(str(v.spec), node) in (cached or {}),
                )
                for v in ctx.volumes(job_id, spec, node)
            ),
            *git_mounts(name, spec.git),
        ],
        # only the owner's network (runtime/network.py): other users' workloads are apart
        network_owner=owner if s.network_isolation == "user" else None,
        # a distributed job's workers: a network of their own, found by rank name
        network_job=job_id if distributed else None,
        aliases=(rank_alias(rank),) if distributed else (),
        hostname=rank_alias(rank) if distributed else None,
        node=node,
        log_max_size=s.container_log_max_size,
        log_max_files=s.container_log_max_files,
        stop_grace=s.preemption_grace,
        working_dir=spec.working_dir,
        read_only=spec.read_only_rootfs,
        # a tmpfs counts against the memory limit: a quarter of it, at most 1 GiB
        tmp_size=max(min(limits.mem_limit // 4, 1024**3), 1024**2),
    )


async def reveal_secrets(ctx: JobContext, owner: str, spec: JobSpec) -> dict[str, str]:
    """The values of the job's secret variables. Raises SecretMissing (deleted since the
    submission) or SecretsUnavailable (no key, or the key that encrypted it is gone)."""
    return {
        var: await ctx.db(ctx.secrets.reveal, owner, secret)
        for var, secret in spec.secret_env.items()
    }


async def create_and_start(
    ctx: JobContext,
    job_id,
    spec: JobSpec,
    gang: list[Rank],
    owner,
    image: str = "",
    cached: dict[tuple[str, str], str] | None = None,
) -> None:
    """Start every worker, rank 0 first (the others connect to it), from ``image`` (see
    :func:`workload_spec`)."""
    secrets = await reveal_secrets(ctx, owner, spec)
    name = gang[0].name
    for r in gang:
        await ctx.runtime.create_and_start(
            workload_spec(
                ctx, job_id, spec, name, r.devices, owner, r.node, secrets, r.rank, image, cached
            )
        )
        fault_point("engine:start")


async def ensure_stopped(ctx: JobContext, name: str, grace: float) -> None:
    """Return only once the engine confirms that ``name`` runs nothing (stopped, or no
    such workload): then, and only then, its GPUs may be released."""
    for kill in (False, True):
        found = await ctx.runtime.state(name)
        if found is None or not found.running:
            return
        if kill:
            await ctx.runtime.kill(name)
            fault_point("engine:kill")
        else:
            await ctx.runtime.stop(name, grace)
            fault_point("engine:stop")
    found = await ctx.runtime.state(name)
    if found is not None and found.running:
        raise StillRunning(f"workload {name} still runs after SIGKILL")


async def gang_stopped(ctx: JobContext, gang: list[Rank], grace: float) -> None:
    """Every worker stopped, as the engine confirms. A gang's workers are all asked at
    once (SIGTERM, no engine thread held through the grace), polled, and what outlives
    the grace is killed: 64 workers never hold the engine's thread pool for 30 s."""
    if len(gang) == 1:
        return await ensure_stopped(ctx, gang[0].name, grace)
    for r in gang:
        await ctx.runtime.terminate(r.name, grace)
        fault_point("engine:stop")
    deadline = asyncio.get_running_loop().time() + grace
    while asyncio.get_running_loop().time() < deadline:
        states = await asyncio.gather(*(ctx.runtime.state(r.name) for r in gang))
        if all(st is None or not st.running for st in states):
            break
        await asyncio.sleep(0.5)
    for r in gang:  # kills what is left, and confirms
        await ensure_stopped(ctx, r.name, 0)


async def restart_in_place(ctx: JobContext, gang: list[Rank]) -> None:
    for r in gang:
        await ctx.runtime.restart_in_place(r.name)


async def start_again(ctx: JobContext, gang: list[Rank]) -> None:
    """Run every worker's ended command again (same node, same volumes)."""
    for r in gang:
        await ctx.runtime.start_again(r.name)
        fault_point("engine:start")


async def remove_workload(ctx: JobContext, name: str) -> None:
    await ctx.runtime.remove(name)
    fault_point("engine:remove")


async def release_network(ctx: JobContext, job_id: str, workers: int) -> None:
    """A distributed job's (``workers`` > 1) workers ended or were removed: its own network
    goes (best effort: engines hold few bridge networks; a resumed job makes its workers,
    and network, anew)."""
    if workers > 1:
        try:
            await ctx.runtime.remove_job_network(ctx.settings.instance, job_id)
        except EngineError as e:  # the sweep of unused networks takes it later
            log.warning("job %s: its network not removed yet: %s", job_id, e)


async def remove_gang(ctx: JobContext, gang: list[Rank]) -> None:
    for r in gang:
        await remove_workload(ctx, r.name)


async def save_logs(ctx: JobContext, job_id: str, gang: list[Rank]) -> None:
    """Keep the tail of each worker's output in the logs directory (see :func:`_save`);
    a distributed job also keeps all ranks in one file, in time order, each line
    prefixed with its rank (what ``logs`` shows by default)."""
    if len(gang) == 1:
        return await _save(ctx, gang[0].name, ctx.log_file(job_id))
    share = rank_log_share(len(gang))  # the job's logs stay about 2 x LOG_KEEP_BYTES
    for r in gang:
        await _save(ctx, r.name, ctx.log_file(job_id, r.rank), True, share)
    await asyncio.to_thread(_merge_saved, ctx, job_id, len(gang))


def _merge_saved(ctx: JobContext, job_id: str, workers: int) -> None:
    per_rank = []
    for rank in range(workers):
        path = ctx.log_file(job_id, rank)
        per_rank.append(path.read_bytes() if path.exists() else b"")
    merged = merge_logs(per_rank)
    ctx.log_file(job_id).write_bytes(merged[-LOG_KEEP_BYTES:])


async def _save(
    ctx: JobContext, name: str, path, timestamps: bool = False, keep: int = LOG_KEEP_BYTES
) -> None:
    """Keep the last ``keep`` bytes (LOG_KEEP_BYTES) of the container's output in ``path``.

    The engine is asked for the tail only (LOG_KEEP_LINES lines), read as a stream into a
    buffer that never holds more than LOG_KEEP_BYTES plus one chunk: however much a job
    printed, saving its log costs bounded memory. A container that is gone leaves the
    log saved earlier (a preemption's) as it was."""

    def save():
        try:
            kept = read_tail(ctx.runtime, name, keep, timestamps)
        except WorkloadGone:
            return
        path.write_bytes(kept)

    await asyncio.to_thread(save)
