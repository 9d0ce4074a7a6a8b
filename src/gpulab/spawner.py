"""NotebookSpawner: JupyterHub's Spawner API for gpulab notebooks, on top of DockerSpawner.

The spawner is a thin adapter: options are validated by :mod:`gpulab.notebooks.options`, GPUs
come from the shared :class:`~gpulab.gpus.ledger.GpuLedger`, states are kept by
:class:`~gpulab.notebooks.records.NotebookRecords`, and what is sent to the engine is built by
:mod:`gpulab.runtime.objects`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from functools import cached_property

from dockerspawner import DockerSpawner
from jupyterhub.utils import maybe_future
from tornado import web
from traitlets import Float, Unicode, default

from . import __version__
from .data.sync import (
    push_all,
    push_verdict,
)
from .db import Database
from .gpus.inventory import load_inventory
from .gpus.ledger import GpuLedger, GpuQuotaExceeded, NoGpuAvailable
from .gpus.sharing import is_fraction
from .lifecycle import InvalidTransition, NotebookState
from .metrics import NOTEBOOK_START
from .names import notebook_container_name, notebook_volume_name, notebook_workload_id
from .notebooks.options import NotebookOptions
from .notebooks.reconcile import NotebookReconciler
from .notebooks.records import LimitExceeded, NotebookRecords
from .resources import format_memory
from .runtime import make_runtime
from .runtime.base import Runtime
from .runtime.docker import APIError, DockerRuntime, EngineError
from .runtime.network import NetworkUnavailable
from .settings import ConfigError, GpulabSettings
from .spawner_cluster import ClusterMixin
from .spawner_container import ContainerMixin
from .spawner_data import NotebookDataMixin, SpawnFailed
from .spawner_network import UserNetworkMixin
from .spawner_options import NotebookOptionsMixin

S = NotebookState


class NotebookSpawner(
    NotebookOptionsMixin,
    NotebookDataMixin,
    ContainerMixin,
    ClusterMixin,
    UserNetworkMixin,
    DockerSpawner,
):
    """GPU notebooks from a framework catalog, with flavors, limits and lifecycle states."""

    _databases: dict[str, Database] = {}
    _reconcilers: dict[str, NotebookReconciler] = {}

    notebook_user = Unicode(
        "1000",
        help="""User (uid or uid:gid) that notebook containers run as, whatever the image says.
        Never root: JupyterHub's single-user server refuses it and it must not own the host.""",
    ).tag(config=True)

    editor_wait_interval = Float(
        0.05, help="Seconds between checks that a starting notebook's editor answers."
    ).tag(config=True)

    @default("remove")
    def _default_remove(self):
        # the container goes; the workspace (a named volume, then object storage) stays
        return True

    @default("pull_policy")
    def _default_pull_policy(self):
        # images are built locally; a missing one is an ERROR, not a pull from who-knows-where
        return "never"

    # --- shared parts ----------------------------------------------------------------------

    @cached_property
    def settings(self) -> GpulabSettings:
        try:
            return GpulabSettings(config=self.config)
        except ConfigError as e:  # the service stops at start-up with the same message
            self.log.error("invalid configuration: %s", e)
            raise web.HTTPError(500, f"gpulab's configuration is invalid: {e}") from None

    @property
    def gpulab_db(self) -> Database:
        url = self.settings.database_url
        if url not in self._databases:
            self._databases[url] = Database(url)
        return self._databases[url]

    @cached_property
    def ledger(self) -> GpuLedger:
        s = self.settings
        if self.clustered:  # the nodes and devices are read before each reservation
            return GpuLedger(self.gpulab_db, s.instance, [], s.placement, [], sharing=s.gpu_sharing)
        devices = load_inventory(s.gpu_devices, s.discover_gpus)
        return GpuLedger(self.gpulab_db, s.instance, devices, sharing=s.gpu_sharing)

    @cached_property
    def records(self) -> NotebookRecords:
        return NotebookRecords(self.gpulab_db, self.settings.instance)

    @cached_property
    def runtime(self) -> Runtime:
        if self.clustered:
            return make_runtime(self.settings, self.client)
        return DockerRuntime(self.client)

    @property
    def executor(self):
        # DockerSpawner's own engine calls share gpulab's wide pool instead of one thread
        return DockerRuntime.shared_executor()

    @property
    def workload_id(self) -> str:
        return notebook_workload_id(self.settings.instance, self.user.name, self.name)

    def _object_name_default(self):
        return notebook_container_name(self.settings.instance, self.user.name, self.name)

    @property
    def volume_name(self) -> str:
        return notebook_volume_name(self.settings.instance, self.user.name, self.name)

    gpulab_options: NotebookOptions | None = None
    gpu_ids: list[str] = []

    # --- state ----------------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.gpu_ids:
            state["gpulab_gpus"] = list(self.gpu_ids)
        if self.gpulab_options:
            state["gpulab_image"] = self.gpulab_options.image
        if self.node:
            state["gpulab_node"] = self.node
        if self.clustered and self.network_name:
            state["gpulab_network"] = self.network_name
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpu_ids = list(state.get("gpulab_gpus", []))
        self.node = state.get("gpulab_node", "") or self.node
        if state.get("gpulab_network"):
            self.network_name = state["gpulab_network"]

    def clear_state(self):
        super().clear_state()
        self.gpu_ids = []

    async def _record(self, state: NotebookState, **kw) -> None:
        """Record a transition; a refused one is logged, never allowed to break a spawn."""
        try:
            await self.runtime.run(self.records.transition, self.user.name, self.name, state, **kw)
        except InvalidTransition as e:
            self.log.warning("%s: not recorded: %s", self._log_name, e)

    async def _current_state(self) -> NotebookState | None:
        return await self.runtime.run(self.records.state, self.user.name, self.name)

    # --- progress -------------------------------------------------------------------------

    def _progress(self, percent: int, message: str) -> None:
        self._progress_events.append({"progress": percent, "message": message})
        self._progress_signal.set()

    async def progress(self):
        seen = 0
        while True:
            while seen < len(self._progress_events):
                yield self._progress_events[seen]
                seen += 1
            if self._progress_done:
                return
            self._progress_signal.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress_signal.wait(), timeout=1)

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def reconciler(self) -> NotebookReconciler:
        """The hub process's periodic reconciliation (notebooks/reconcile.py), one per instance."""
        key = f"{self.settings.instance}|{self.settings.database_url}"
        if key not in self._reconcilers:
            self._reconcilers[key] = NotebookReconciler(
                self.settings, self.records, self.ledger, self.runtime
            )
        return self._reconcilers[key]

    @contextlib.contextmanager
    def _in_transit(self):
        """While this spawner starts or stops its notebook, the reconciler leaves it alone."""
        busy = self.reconciler.busy
        busy.add(self.workload_id)
        try:
            yield
        finally:
            busy.discard(self.workload_id)

    async def start(self):
        self._progress_events: list[dict] = []
        self._progress_signal = asyncio.Event()
        self._progress_done = False
        self.reconciler.ensure_running()
        self._started_at = time.monotonic()
        try:
            with self._in_transit():
                return await self._start()
        finally:
            self._progress_done = True
            self._progress_signal.set()

    async def _start(self):
        opts = self.gpulab_options or self.parse_options(self.user_options)
        self.gpulab_options = opts
        user, server = self.user.name, self.name
        s = self.settings
        res = opts.resources
        summary = (
            f"{opts.framework} {opts.version} with {opts.editor}; "
            f"{res.cpus:g} CPU, {format_memory(res.memory)}, {res.gpus:g} GPU"
        )
        groups = self._user_groups()
        if self.clustered:
            await self._push_before_start()
        try:
            await self.runtime.run(
                self.records.start,
                user,
                server,
                res,
                s.limits_for(user, groups),
                reason="SPAWN",
                message=summary,
                options=opts.to_json(),
                user_options=dict(self.user_options or {}),
                container=self.object_name,
            )
        except LimitExceeded as e:
            self._progress(100, f"FAILED: {e}")
            raise SpawnFailed(409, str(e)) from None
        except InvalidTransition as e:
            # the record is busy elsewhere (a push retry is STOPPING it): starting now would
            # skip the limits and race that push
            msg = f"this notebook is busy ({e}); try again once it has stopped"
            self._progress(100, f"FAILED: {msg}")
            raise SpawnFailed(409, msg) from None
        self._progress(5, f"Options validated: {summary}")

        # GPUs
        self._progress(15, f"Reserving {res.gpus:g} GPU(s)" if res.gpus else "No GPU requested")
        try:
            await self.refresh_cluster()
        except EngineError as e:
            await self._fail(S.ERROR, "ENGINE_UNREACHABLE", f"container engine error: {e}")
            raise SpawnFailed(503, f"the container engine did not answer: {e}") from None
        try:
            self.gpu_ids = await self.runtime.run(
                self.ledger.reserve,
                self.workload_id,
                user,
                "notebook",
                res.gpus,
                quota=s.gpu_quota_for(user, groups),
            )
        except GpuQuotaExceeded as e:
            await self._fail(S.FAILED, "GPU_QUOTA_EXCEEDED", str(e))
            raise SpawnFailed(409, str(e)) from None
        except NoGpuAvailable as e:
            await self._fail(S.FAILED, "NO_GPU_AVAILABLE", str(e))
            raise SpawnFailed(409, str(e)) from None
        if self.gpu_ids:
            share = f" ({res.gpus:g} of it, shared)" if is_fraction(res.gpus) else ""
            self._progress(20, f"GPUs reserved: {', '.join(self.gpu_ids)}{share}")
        if self.clustered:
            await self._place()

        # image
        self._progress(30, f"Preparing image {opts.image}")
        try:
            present = await self.runtime.image_exists(self.engine_image(opts.image))
        except EngineError as e:
            await self._fail(S.ERROR, "ENGINE_UNREACHABLE", f"container engine error: {e}")
            raise SpawnFailed(503, f"the container engine did not answer: {e}") from None
        if not present:
            where = "in the registry" if self.clustered else "on this host"
            image = self.engine_image(opts.image)
            msg = f"image {image} is missing {where} (the admin builds it: make images)"
            await self._fail(S.ERROR, "IMAGE_MISSING", msg)
            raise SpawnFailed(503, msg)

        # data: pull the workspace and the volumes from object storage
        self._skip_push = False
        vols = self.data_volumes([str(v) for v in opts.volumes])
        await self._pull(vols)

        # container
        self.configure_container(res, vols)
        try:  # only the user's own network (spawner_network.py, spawner_cluster.py)
            if self.clustered:
                await self.join_cluster_network()
            else:
                await self._join_user_network()
        except (NetworkUnavailable, EngineError) as e:
            await self._fail(S.ERROR, "NETWORK_UNAVAILABLE", str(e))
            raise SpawnFailed(503, str(e)) from None
        self._progress(60, "Starting the container")
        try:
            ip, port = await super().start()
        except Exception as e:
            # a process that dies at once makes DockerSpawner fail to read its port: that is the
            # notebook's FAILED (with its exit code), not a platform ERROR
            refused = isinstance(e, APIError)  # e.g. "could not select device driver"
            exited = await self._exit_status() if self.object_id and not refused else None
            if exited is not None and exited[0] != -1:
                await self._fail(S.FAILED, "EXITED", exited[1], exit_code=exited[0])
                raise SpawnFailed(500, exited[1]) from None
            why = e.explanation if isinstance(e, APIError) else str(e)
            msg = f"the engine could not start the container: {why}"
            await self._fail(S.ERROR, "ENGINE_ERROR", msg)
            raise SpawnFailed(503, msg) from None

        # editor
        self._progress(80, f"Waiting for {opts.editor} to answer")
        await self._wait_for_editor(ip, port)
        await self._record(S.RUNNING, reason="READY", message=f"{opts.editor} answers")
        NOTEBOOK_START.observe(time.monotonic() - self._started_at)  # in the hub's /hub/metrics
        self._progress(100, f"{opts.editor} is ready")
        return (ip, port)

    async def _fail(self, state: NotebookState, reason: str, message: str, exit_code=None):
        self.log.error("%s: %s: %s", self._log_name, reason, message)
        self._progress(100, f"{state.value}: {message}")
        await self._record(state, reason=reason, message=message, exit_code=exit_code)

    async def poll(self):
        self.reconciler.ensure_running()
        status = await super().poll()
        if status is not None:
            current = await self._current_state()
            if current is S.RUNNING:
                exited = await self._exit_status()
                if exited and exited[0] != 0:
                    await self._record(
                        S.FAILED, reason="EXITED", message=exited[1], exit_code=exited[0]
                    )
        return status

    async def stop(self, now=False):
        with self._in_transit():
            await self._stop(now)

    async def _stop(self, now=False):
        nb = await self.runtime.run(self.records.get, self.user.name, self.name) or {}
        current = S(nb["state"]) if nb.get("state") else None
        ran = bool(self.object_id)  # a notebook container existed: it may have written data
        # a start refused before any container (limits, a push that still fails) leaves an
        # ended record as it was: a SYNC_FAILED one keeps saying that its data waits
        ended = current in (S.FAILED, S.ERROR) or (
            current in (S.SYNC_FAILED, S.STOPPED) and not ran
        )
        last = ((nb.get("history") or [{}])[-1]).get("reason", "")
        self.node = nb.get("node") or self.node  # a cluster: where its volumes are
        if last == "NODE_LOST":
            # its volumes went with the node: nothing can be pushed (the reconciler said so)
            ran = False
        if not ended:
            reason, message = await self.runtime.run(
                self.records.take_stop_reason, self.user.name, self.name
            )
            await self._record(S.STOPPING, reason=reason, message=message)
        try:
            if ended and self.object_id:
                # keep a failed container (stopped) for its logs and configuration; the next
                # start or a delete removes it
                await self.stop_object()
                self.clear_state()
            else:
                await super().stop(now=now)
        except APIError as e:
            self.log.error("%s: could not stop: %s; killing it", self._log_name, e)
            with contextlib.suppress(Exception):
                await self.runtime.kill(self.object_name)
        # GPUs go back only once the engine confirms that the container runs nothing; if it
        # does not, the record stays STOPPING with its GPUs, and the reconciler stops the
        # container and settles the record once the engine answers (notebooks/reconcile.py)
        found = await self.runtime.state(self.object_name)
        if found is not None and found.running:
            raise SpawnFailed(503, f"notebook container {self.object_name} still runs")
        released = await self.runtime.run(self.ledger.release, self.workload_id)
        if released:
            self.log.info("%s released GPUs %s", self._log_name, ", ".join(released))
        self.gpu_ids = []

        # push the workspace and writable volumes; a failure keeps every local byte
        ok, message = True, "compute released"
        if ran and not getattr(self, "_skip_push", False):
            vols = self.data_volumes(await self._recorded_volume_specs())
            ok, message = push_verdict(await push_all(self.data, vols))
        if not ok:
            await self._record(S.SYNC_FAILED, reason="PUSH_FAILED", message=message)
        elif not ended:
            await self._record(S.STOPPED, reason="STOPPED", message=message)
        await self._release_user_network()  # after the outcome is recorded (about 0.2 s)

    async def delete_forever(self):
        """A named server deleted for good: its remote workspace, container, volumes and GPUs."""
        with self._in_transit():
            done = await self._delete_forever()
        if done:
            # Spawner.delete_forever "can be async": DockerSpawner's is a plain method
            await maybe_future(super().delete_forever())

    async def check_allowed(self, image):
        # the image was validated against the catalog in apply_notebook_options
        if self.gpulab_options and image == self.gpulab_options.image:
            return image
        raise web.HTTPError(400, f"image {image!r} is not in the catalog")


__all__ = ["NotebookSpawner", "SpawnFailed", "__version__"]
