"""What a job's life asks of the engine: create and start its container, stop it (confirmed),
restart its command in place, keep the tail of its log.

A mixin of :class:`~gpulab.jobs.runner.JobLife` (it needs ``s``, ``runtime``, ``workload``,
``volumes`` and ``log_file`` from the supervisor). Every call that changes something is
followed by a fault-injection point (``engine:NAME``, see :mod:`gpulab.faults`).
"""

from __future__ import annotations

import asyncio
import contextlib

from ..faults import fault_point
from ..gpus.inventory import device_id
from ..resources import container_limits
from ..runtime.base import Mount, WorkloadGone, WorkloadSpec
from ..runtime.objects import workload_labels
from .git_sources import git_mounts
from .spec import JobSpec
from .spec_extras import job_path, port_env

LOG_KEEP_BYTES = 10 * 1024 * 1024
LOG_KEEP_LINES = 200_000  # asked of the engine: the tail, not the whole log


class StillRunning(RuntimeError):
    """The engine did not confirm that a container stopped: its GPUs stay booked."""


class JobContainer:
    """The engine side of one job (a mixin of the supervisor, through JobLife)."""

    def workload_spec(
        self, job_id, spec: JobSpec, name, devices, owner, node, secrets=None
    ) -> WorkloadSpec:
        """What the engine is asked to run for this job (any backend). ``secrets``: the values
        of ``spec.secret_env`` (variable -> value), revealed for this container only."""
        s = self.s
        limits = container_limits(spec.resources, s.pids_limit, s.shm_fraction)
        env = {
            **spec.env,
            **(secrets or {}),
            **port_env(spec.ports, job_path(job_id)),
            "GPULAB_JOB_ID": job_id,
            "GPULAB_JOB_NAME": spec.name,
        }
        return WorkloadSpec(
            name=name,
            image=self.runtime.image_ref(spec.image),
            command=[*spec.command, *spec.args],
            env=env,
            labels={
                **spec.labels,
                **workload_labels(s.instance, "job", owner, self.workload(job_id), devices),
                "org.gpulab.job": job_id,
            },
            user="1000:100",
            cpus=spec.resources.cpus,
            memory=limits.mem_limit,
            pids_limit=limits.pids_limit,
            shm_size=limits.shm_size,
            gpu_ids=[device_id(d) for d in devices],
            mounts=[
                *(
                    Mount(v.docker_volume, v.spec.mount, read_only=v.spec.mode == "ro")
                    for v in self.volumes(job_id, spec, node)
                ),
                *git_mounts(name, spec.git),
            ],
            # only the owner's network (runtime/network.py): other users' workloads are apart
            network_owner=owner if s.network_isolation == "user" else None,
            node=node,
            log_max_size=s.container_log_max_size,
            log_max_files=s.container_log_max_files,
            stop_grace=s.preemption_grace,
            working_dir=spec.working_dir,
            read_only=spec.read_only_rootfs,
            # a tmpfs counts against the memory limit: a quarter of it, at most 1 GiB
            tmp_size=max(min(limits.mem_limit // 4, 1024**3), 1024**2),
        )

    async def reveal_secrets(self, owner: str, spec: JobSpec) -> dict[str, str]:
        """The values of the job's secret variables. Raises SecretMissing (deleted since the
        submission) or SecretsUnavailable (no key, or the key that encrypted it is gone)."""
        return {
            var: await self.db(self.secrets.reveal, owner, secret)
            for var, secret in spec.secret_env.items()
        }

    async def _create_and_start(self, job_id, spec: JobSpec, name, devices, owner, node) -> None:
        secrets = await self.reveal_secrets(owner, spec)
        await self.runtime.create_and_start(
            self.workload_spec(job_id, spec, name, devices, owner, node, secrets)
        )
        fault_point("engine:start")

    async def ensure_stopped(self, name: str, grace: float) -> None:
        """Return only once the engine confirms that ``name`` runs nothing (stopped, or no
        such workload): then, and only then, its GPUs may be released."""
        for kill in (False, True):
            found = await self.runtime.state(name)
            if found is None or not found.running:
                return
            if kill:
                await self.runtime.kill(name)
                fault_point("engine:kill")
            else:
                await self.runtime.stop(name, grace)
                fault_point("engine:stop")
        found = await self.runtime.state(name)
        if found is not None and found.running:
            raise StillRunning(f"workload {name} still runs after SIGKILL")

    async def _restart_in_place(self, name: str) -> None:
        await self.runtime.restart_in_place(name)

    async def remove_workload(self, name: str) -> None:
        await self.runtime.remove(name)
        fault_point("engine:remove")

    async def save_logs(self, job_id: str, name: str) -> None:
        """Keep the last LOG_KEEP_BYTES of the container's output in the logs directory.

        The engine is asked for the tail only (LOG_KEEP_LINES lines), read as a stream into a
        buffer that never holds more than LOG_KEEP_BYTES plus one chunk: however much a job
        printed, saving its log costs bounded memory. A container that is gone leaves the
        log saved earlier (a preemption's) as it was."""

        def save():
            kept = bytearray()
            try:
                stream = self.runtime.log_stream(name, follow=False, tail=LOG_KEEP_LINES)
                try:
                    for chunk in stream:
                        kept += chunk
                        if len(kept) > 2 * LOG_KEEP_BYTES:
                            del kept[:-LOG_KEEP_BYTES]
                finally:
                    with contextlib.suppress(Exception):
                        stream.close()
            except WorkloadGone:
                return
            self.log_file(job_id).write_bytes(bytes(kept[-LOG_KEEP_BYTES:]))

        await asyncio.to_thread(save)
