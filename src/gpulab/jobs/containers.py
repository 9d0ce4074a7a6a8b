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
from ..resources import container_limits
from ..runtime.docker import APIError, NotFound
from ..runtime.network import ensure_user_network, is_missing_network
from ..runtime.network import network_for as _network_for
from ..runtime.objects import gpu_request, job_container_config, log_options, workload_labels
from .spec import JobSpec

LOG_KEEP_BYTES = 10 * 1024 * 1024
LOG_KEEP_LINES = 200_000  # asked of the engine: the tail, not the whole log


class StillRunning(RuntimeError):
    """The engine did not confirm that a container stopped: its GPUs stay booked."""


class JobContainer:
    """The engine side of one job (a mixin of the supervisor, through JobLife)."""

    async def engine(self, point: str, fn, *args, **kw):
        """One engine call off the event loop, with the fault-injection point after it."""
        out = await self.runtime.run(fn, *args, **kw)
        fault_point(f"engine:{point}")
        return out

    async def _create_and_start(self, job_id, spec: JobSpec, name, devices, owner) -> None:
        s = self.s
        gpu_host, gpu_env = gpu_request(devices, s.gpu_mode)
        limits = {
            **container_limits(spec.resources, s.pids_limit, s.shm_fraction).host_config(),
            **log_options(s.container_log_max_size, s.container_log_max_files),
        }
        config = job_container_config(
            image=spec.image,
            name=name,
            command=[*spec.command, *spec.args],
            env={**spec.env, **gpu_env, "GPULAB_JOB_ID": job_id, "GPULAB_JOB_NAME": spec.name},
            labels={
                **spec.labels,
                **workload_labels(s.instance, "job", owner, self.workload(job_id), devices),
                "org.gpulab.job": job_id,
            },
            user="1000:100",
            limits=limits,
            gpu_host=gpu_host,
            volumes={
                v.docker_volume: {
                    "bind": v.spec.mount,
                    "mode": "ro" if v.spec.mode == "ro" else "rw",
                }
                for v in self.volumes(job_id, spec)
            },
            runner=self.runner_path,
            # only the owner's network (runtime/network.py): other users' containers are apart
            network=(network := _network_for(s.network_isolation, s.instance, owner)),
        )
        client = self.runtime.client
        host = config.pop("host_config")

        def create():
            for attempt in (1, 2):
                with contextlib.suppress(NotFound):
                    client.remove_container(name, force=True)
                if network:  # joined by ID: unambiguous while a racing duplicate exists
                    host["network_mode"] = ensure_user_network(client, s.instance, owner)
                try:
                    client.create_container(host_config=client.create_host_config(**host), **config)
                    fault_point("engine:create")
                    client.start(name)
                    return
                except APIError as e:
                    # pruned between our look-up and our start: make it again, once
                    if attempt == 2 or not (network and is_missing_network(e)):
                        raise

        await self.runtime.run(create)
        fault_point("engine:start")

    async def ensure_stopped(self, name: str, grace: float) -> None:
        """Return only once the engine confirms that ``name`` runs nothing (stopped, or no
        such container): then, and only then, its GPUs may be released."""
        client = self.runtime.client
        for kill in (False, True):
            info = await self.runtime.inspect_container(name)
            if info is None or not info["State"].get("Running"):
                return
            with contextlib.suppress(NotFound):
                if kill:
                    await self.engine("kill", client.kill, name)
                else:
                    await self.engine("stop", client.stop, name, timeout=int(grace))
        info = await self.runtime.inspect_container(name)
        if info is not None and info["State"].get("Running"):
            raise StillRunning(f"container {name} still runs after SIGKILL")

    async def _restart_in_place(self, name: str) -> None:
        client = self.runtime.client

        def restart():
            ex = client.exec_create(
                name,
                ["sh", "-c", "touch /tmp/.gpulab-restart && kill -KILL $(cat /tmp/.gpulab-child)"],
                user="1000:100",
            )
            client.exec_start(ex["Id"])

        await self.runtime.run(restart)

    async def save_logs(self, job_id: str, name: str) -> None:
        """Keep the last LOG_KEEP_BYTES of the container's output in the logs directory.

        The engine is asked for the tail only (LOG_KEEP_LINES lines), read as a stream into a
        buffer that never holds more than LOG_KEEP_BYTES plus one chunk: however much a job
        printed, saving its log costs bounded memory. A container that is gone leaves the
        log saved earlier (a preemption's) as it was."""

        def save():
            kept = bytearray()
            try:
                stream = self.runtime.client.logs(
                    name, stdout=True, stderr=True, stream=True, tail=LOG_KEEP_LINES
                )
                try:
                    for chunk in stream:
                        kept += chunk
                        if len(kept) > 2 * LOG_KEEP_BYTES:
                            del kept[:-LOG_KEEP_BYTES]
                finally:
                    with contextlib.suppress(Exception):
                        stream.close()
            except NotFound:
                return
            self.log_file(job_id).write_bytes(bytes(kept[-LOG_KEEP_BYTES:]))

        await asyncio.to_thread(save)
