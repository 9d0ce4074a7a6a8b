"""The notebook's container as the spawner configures it and waits for it: limits, GPUs
(whole or shared), labels, environment and volumes; then its editor answering, or the exit
status that explains why it did not. A mixin of :class:`~gpulab.spawner.NotebookSpawner`."""

from __future__ import annotations

import asyncio
import time

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from .gpus.sharing import is_fraction, share_container
from .lifecycle import NotebookState
from .names import workload_labels
from .resources import container_limits, format_memory
from .runtime.objects import gpu_request, hardened_host_config, log_options
from .spawner_data import SpawnFailed

S = NotebookState


class ContainerMixin:
    """Mixin of :class:`~gpulab.spawner.NotebookSpawner`: its container."""

    def configure_container(self, res, vols) -> None:
        """What DockerSpawner (or, on a cluster, plan_workload) creates the container with:
        the hardened host config and limits, the GPUs (whole, or a share of a shared one),
        labels, environment, the workspace and data volumes."""
        s = self.settings
        user, server = self.user.name, self.name
        gpu_host, gpu_env = gpu_request(self.gpu_ids, s.gpu_mode)
        share_env, share_binds = {}, {}
        if is_fraction(res.gpus) and self.gpu_ids:
            dev = next((d for d in self.ledger.devices if d.key == self.gpu_ids[0]), None)
            share_env, share_binds = share_container(
                res.gpus, dev.memory if dev else "", s.gpu_sharing_mode, s.mps_pipe_directory
            )
        limits = container_limits(res, s.pids_limit, s.shm_fraction)
        self.extra_host_config = {
            **hardened_host_config(),
            **log_options(s.container_log_max_size, s.container_log_max_files),
            **limits.host_config(),
            **gpu_host,
            # keep an exited container until stop() removes it, so its exit code can be read
            "auto_remove": False,
        }
        self.extra_create_kwargs = {
            "labels": workload_labels(
                s.instance, "notebook", user, self.workload_id, self.gpu_ids, server=server
            ),
            "user": self.notebook_user,
        }
        # how often the notebook server reports its activity to the hub (the idle stop's input)
        activity = {"JUPYTERHUB_ACTIVITY_INTERVAL": str(s.activity_report_interval)}
        # a previous start's share (this spawner may have started with another request)
        kept = {
            k: v
            for k, v in self.environment.items()
            if k != "GPULAB_GPU_FRACTION" and not k.startswith("CUDA_MPS_")
        }
        self.environment = {**kept, **gpu_env, **share_env, **activity}
        if self.clustered:
            self.plan_workload(
                cpus=res.cpus,
                memory=limits.mem_limit,
                pids_limit=limits.pids_limit,
                shm_size=limits.shm_size,
                labels=self.extra_create_kwargs["labels"],
                mounts={
                    self.volume_name: (s.workspace_dir, False),
                    **{
                        v.docker_volume: (v.spec.mount, v.spec.mode == "ro")
                        for v in vols
                        if v.label != "workspace"
                    },
                },
            )
        self.volumes = {
            self.volume_name: s.workspace_dir,
            **{
                v.docker_volume: {
                    "bind": v.spec.mount,
                    "mode": "ro" if v.spec.mode == "ro" else "rw",
                }
                for v in vols
                if v.label != "workspace"
            },
            **share_binds,
        }
        self.notebook_dir = s.workspace_dir

    async def _wait_for_editor(self, ip: str, port: int) -> None:
        url = f"http://{ip}:{port}{self.server.base_url}api"
        client = AsyncHTTPClient()
        deadline = time.monotonic() + self.http_timeout
        last_check = 0.0
        while time.monotonic() < deadline:
            try:
                await client.fetch(url, request_timeout=2, connect_timeout=1)
                return
            except HTTPClientError as e:
                if e.code < 500 and e.code != 599:
                    return  # any HTTP answer below 500 means the server is up
            except OSError:
                pass
            if time.monotonic() - last_check > 0.5:
                last_check = time.monotonic()
                exited = await self._exit_status()
                if exited is not None:
                    code, msg = exited
                    await self._fail(S.FAILED, "EXITED", msg, exit_code=code)
                    raise SpawnFailed(500, msg)
            await asyncio.sleep(self.editor_wait_interval)
        msg = f"the editor did not answer within {self.http_timeout:g} s"
        await self._fail(S.FAILED, "READY_TIMEOUT", msg)
        raise SpawnFailed(500, msg)

    async def _exit_status(self) -> tuple[int, str] | None:
        """(exit code, explanation) if the container has stopped, else None."""
        found = await self.runtime.state(self.object_name)
        if found is None:
            return (-1, "the notebook container vanished")
        if found.running:
            return None
        code = -1 if found.exit_code is None else found.exit_code
        if found.oom:
            limit = self.gpulab_options.resources.memory if self.gpulab_options else 0
            why = f"killed: out of memory (limit {format_memory(limit)})"
        else:
            why = found.error or "the notebook process exited"
        return (code, f"{why} (exit code {code})")
