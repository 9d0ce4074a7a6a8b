"""NotebookSpawner: JupyterHub's Spawner API for gpulab notebooks.

A thin adapter on DockerSpawner (its traits, its state): each hook hands off once,
to :mod:`gpulab.notebooks.life` (start, stop, delete), :mod:`gpulab.notebooks.form` (the
form and the options' checks) or the :class:`~gpulab.runtime.base.Runtime` (what the engine
says of the container). The engine is the Runtime that :func:`gpulab.runtime.make_runtime`
chose, on one host and on a Swarm alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

from dockerspawner import DockerSpawner
from jupyterhub.utils import maybe_future
from tornado import web
from traitlets import Float, Unicode, default

from .. import __version__
from ..data.datasets import DatasetCache, DatasetCopies
from ..db import Database, SchemaMismatch
from ..disk_ledger import DiskLedger
from ..gpus.ledger import GpuLedger
from ..hub_process import starting_hub
from ..metrics import NOTEBOOK_START
from ..names import notebook_container_name, notebook_volume_name, notebook_workload_id
from ..runtime import make_runtime
from ..runtime.base import EngineError, Runtime, WorkloadState
from ..secrets import SecretStore, store_for
from ..settings import ConfigError, GpulabSettings
from . import form, life
from .announce import announcer_for
from .container import HubSide
from .life import Held, Notebook, NotebookRefused
from .options import NotebookOptions, form_to_options
from .reconcile import NotebookReconciler
from .records import NotebookRecords

log = logging.getLogger(__name__)


def report_at_hub_start() -> None:
    """Called from the hub's configuration file: once the hub has read all of it (a file that
    loads this one may add to it), log the GPUs this hub hands out (the devices with their
    model and memory, the driver and CUDA versions, or at WARNING why there is none), and ask
    the engine whether it can hand them to containers in ``gpu_mode``: when it cannot, say so
    at ERROR with what to configure, and refuse GPU notebooks with that message (CPU ones
    still start: they are given no GPU in any mode); and at WARNING each DockerSpawner option
    set that gpulab ignores. Outside the hub's process (the service reads the same file and
    checks for itself, refusing to start), nothing."""
    starting = starting_hub()
    if starting is None:
        return
    hub, loop = starting

    def report():  # the hub's whole configuration is read by now (its config is a new object)
        warn_ignored_options(hub.config, NotebookSpawner.mro(), log)
        task = loop.create_task(_report_gpus(hub.config))
        _reports.add(task)
        task.add_done_callback(_reports.discard)

    loop.call_soon(report)


#: the report tasks running (the event loop keeps only weak references)
_reports: set[asyncio.Task] = set()


async def _report_gpus(config) -> None:
    try:
        settings = GpulabSettings(config=config)
    except ConfigError:
        return  # said by the first spawn, and by the service, which stops
    try:
        runtime = make_runtime(settings, hub_engine(config))  # the engine spawns will use
    except ValueError:
        return  # a runtime refused (a Swarm without per-user networks): said by every spawn
    runtime.log_gpus(log)
    if not settings.check_gpu_runtime:
        return
    try:
        refusal = await runtime.gpu_delivery_refusal()
    except EngineError as e:
        log.warning("could not ask the container engine which runtimes it has: %s", e)
        return
    if refusal:
        log.error("GPU notebooks are refused: this engine cannot hand out the GPUs: %s", refusal)
        NotebookSpawner.gpu_refusals[settings.instance] = refusal


def hub_engine(config) -> Callable[[], Any]:
    """The hub's engine client, as a function the runtime calls on first use: DockerSpawner's
    (one per process), made from ``DOCKER_HOST``, ``DOCKER_TLS_VERIFY`` and
    ``DOCKER_CERT_PATH`` as ``docker.from_env`` does, unless ``client_kwargs`` or
    ``tls_config`` name the engine explicitly. Made by the runtime, an engine that does not
    answer comes up as its EngineError (naming the engine), never as the SDK's."""
    return lambda: NotebookSpawner(config=config).client


_NETWORK = "c.GpulabSettings.network_isolation (gpulab decides how the hub reaches a notebook)"
_CONTAINER = (
    "c.GpulabSettings (gpulab builds the notebook's container itself: pids_limit, gpu_mode, "
    "container_log_max_size, network_isolation)"
)
_STORAGE = "c.GpulabSettings.object_stores, workspace_store and volume_grants"
_NAMES = "c.GpulabSettings.instance (gpulab names its containers and volumes)"
_SIZE = "c.GpulabSettings.flavors, max_resources and user_max_resources"

#: DockerSpawner's options that NotebookSpawner does not read (the Runtime runs the notebook,
#: from gpulab's settings and the user's options), each with what to use instead. Set, they
#: are named in a WARNING when the hub starts (report_at_hub_start), else when it makes its
#: first notebook spawner. Those DockerSpawner itself reads still apply: ``port``
#: (``container_port``), where the notebook's server listens; ``client_kwargs`` and the
#: ``tls*`` options, how the hub reaches its engine. (It ignores ``hub_ip_connect`` and
#: ``use_docker_client_env`` itself, with its own warning.)
IGNORED_DOCKER_OPTIONS: dict[str, str] = {
    "image": "the catalog, c.GpulabSettings.frameworks (users choose a framework and version)",
    "container_image": "the catalog, c.GpulabSettings.frameworks",
    "allowed_images": "c.GpulabSettings.allowed_images",
    "image_whitelist": "c.GpulabSettings.allowed_images",
    "pull_policy": (
        "images built or pushed beforehand (make images; c.GpulabSettings.image_registry on a "
        "Swarm): a missing image is refused, never pulled at a spawn"
    ),
    "cpu_limit": _SIZE,
    "mem_limit": _SIZE,
    "extra_create_kwargs": _CONTAINER,
    "extra_host_config": _CONTAINER,
    "post_start_cmd": "the image's own start-up",
    "volumes": _STORAGE,
    "read_only_volumes": _STORAGE,
    "mounts": _STORAGE,
    "format_volume_name": _STORAGE,
    "network_name": _NETWORK,
    "use_internal_ip": _NETWORK,
    "use_internal_hostname": _NETWORK,
    "links": _NETWORK,
    "host_ip": _NETWORK,
    "container_ip": _NETWORK,
    "name_template": _NAMES,
    "container_name_template": _NAMES,
    "prefix": _NAMES,
    "container_prefix": _NAMES,
    "escape": _NAMES,
    "remove": "nothing: gpulab removes a notebook's container at every stop (a failed one at "
    "the next start or delete)",
    "remove_containers": "nothing: gpulab removes a notebook's container at every stop",
    "certs_volume_name": "nothing: gpulab's notebooks do not mount DockerSpawner's certificates",
    "move_certs_image": "nothing: gpulab's notebooks do not mount DockerSpawner's certificates",
}


def ignored_options(config, classes) -> list[tuple[str, str]]:
    """("c.Section.option", what to use instead) of each option in
    :data:`IGNORED_DOCKER_OPTIONS` that ``config`` sets for one of ``classes`` (the
    spawner's class and its bases: a value set on ``c.Spawner`` or ``c.DockerSpawner``
    reaches NotebookSpawner too)."""
    sections = [c.__name__ for c in classes if c.__name__ in config]
    found = []
    for name, instead in IGNORED_DOCKER_OPTIONS.items():
        section = next((s for s in sections if name in config[s]), None)
        if section is not None:
            found.append((f"c.{section}.{name}", instead))
    return found


_warned = False


def warn_ignored_options(config, classes, logger) -> None:
    """Once a process: a WARNING for each DockerSpawner option ``config`` sets that gpulab
    ignores, naming it and what to use instead."""
    global _warned
    if _warned:
        return
    _warned = True
    for option, instead in ignored_options(config, classes):
        logger.warning(
            "%s is set, but gpulab's NotebookSpawner ignores it; use %s", option, instead
        )


class SpawnFailed(web.HTTPError):
    """A spawn that cannot go on; the message is what the user sees on the progress page."""

    def __init__(self, status: int, message: str):
        super().__init__(status, "%s", message)
        self.message = message
        self.jupyterhub_message = message


class NotebookSpawner(DockerSpawner):
    """GPU notebooks from a framework catalog, with flavors, limits and lifecycle states."""

    _databases: dict[str, Database] = {}
    _reconcilers: dict[str, NotebookReconciler] = {}
    _runtimes: dict[str, Runtime] = {}
    #: the hub process's handle on the dataset cache, one per instance and database
    _dataset_caches: dict[str, DatasetCache] = {}
    #: instance -> why the engine cannot hand out GPUs (report_at_hub_start asked it)
    gpu_refusals: dict[str, str] = {}

    notebook_user = Unicode(
        "1000",
        help="""User (uid or uid:gid) that notebook containers run as, whatever the image says.
        Never root: JupyterHub's single-user server refuses it and it must not own the host.""",
    ).tag(config=True)

    editor_wait_interval = Float(
        0.05, help="Seconds between checks that a starting notebook's editor answers."
    ).tag(config=True)

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return lambda spawner, user_options: spawner.apply_notebook_options(user_options)

    @default("options_form")
    def _default_options_form(self):
        return lambda spawner: spawner.render_options_form()

    @default("options_from_form")
    def _default_options_from_form(self):
        return lambda formdata: form_to_options(formdata)

    gpulab_options: NotebookOptions | None = None
    #: the spawn page's events of the start under way; None until start() begins (JupyterHub
    #: may ask for progress() as soon as the spawn is requested, before start() runs)
    _progress_events: list[dict] | None = None
    _progress_signal: asyncio.Event | None = None
    _progress_done = False
    #: start_timeout as configured, before a GPU wait was added to it
    _base_start_timeout: int | None = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # a hub whose configuration file does not call report_at_hub_start: its first spawner
        warn_ignored_options(self.config, type(self).mro(), self.log)

    # --- what it is handed --------------------------------------------------------------------

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
            try:
                self._databases[url] = Database(url)
            except SchemaMismatch as e:  # the service stopped at start-up with the same words
                self.log.error("gpulab's database cannot be used: %s", e)
                raise web.HTTPError(503, f"gpulab is being upgraded: {e}") from None
        return self._databases[url]

    @cached_property
    def secret_store(self) -> SecretStore | None:
        """The users' secrets (an image's pull secret); None when the keys cannot be read
        (the service stops at start-up with the same words)."""
        try:
            return store_for(self.settings, self.gpulab_db)
        except ValueError as e:
            self.log.error("gpulab's secrets cannot be read: %s", e)
            return None

    @cached_property
    def ledger(self) -> GpuLedger:
        """The runtime's GPUs (a cluster's are read at each reservation)."""
        return GpuLedger.for_runtime(self.gpulab_db, self.settings, self.runtime)

    @cached_property
    def records(self) -> NotebookRecords:
        # every transition it records is told to the notices' announcer (notebooks/announce)
        return NotebookRecords(
            self.gpulab_db, self.settings.instance, observer=announcer_for(self.settings)
        )

    @property
    def runtime(self) -> Runtime:
        """The hub's one Runtime per instance (the backend make_runtime chose)."""
        key = f"{self.settings.instance}|{self.settings.runtime}"
        if key not in self._runtimes:
            # DockerSpawner's engine client, shared, made by the runtime on first use
            self._runtimes[key] = make_runtime(self.settings, hub_engine(self.config))
        return self._runtimes[key]

    @property
    def datasets(self) -> DatasetCache:
        """The hub's side of the nodes' dataset caches (the service's jobs share them)."""
        key = f"{self.settings.instance}|{self.settings.runtime}|{self.settings.database_url}"
        if key not in self._dataset_caches:
            copies = DatasetCopies(self.gpulab_db, self.settings.instance)
            self._dataset_caches[key] = DatasetCache(copies, self.settings, self.runtime)
        return self._dataset_caches[key]

    @property
    def workload_id(self) -> str:
        return notebook_workload_id(self.settings.instance, self.user.name, self.name)

    def _object_name_default(self):
        return notebook_container_name(self.settings.instance, self.user.name, self.name)

    @property
    def volume_name(self) -> str:
        return notebook_volume_name(self.settings.instance, self.user.name, self.name)

    def _user_groups(self) -> list[str]:
        return [g.name for g in getattr(self.user, "groups", [])]

    @cached_property
    def held(self) -> Held:
        return Held()

    def notebook(self) -> Notebook:
        """This notebook, as its life is handed it."""
        s = self.settings
        nb = Notebook(
            settings=s,
            runtime=self.runtime,
            records=self.records,
            ledger=self.ledger,
            disk_ledger=DiskLedger(self.gpulab_db, s.instance),
            user=self.user.name,
            server=self.name,
            groups=self._user_groups(),
            workload_id=self.workload_id,
            container=self.object_name,
            volume=self.volume_name,
            url_path=self.server.base_url if self.server else "",
            held=self.held,
            progress=self._progress,
            options=self.gpulab_options,
            http_timeout=self.http_timeout,
            editor_wait_interval=self.editor_wait_interval,
            gpu_refusal=self.gpu_refusals.get(s.instance),
            secrets=self.secret_store,
            datasets=self.datasets,
        )
        self.held.ran = bool(self.object_id)
        return nb

    # --- state --------------------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.held.gpu_ids:
            state["gpulab_gpus"] = list(self.held.gpu_ids)
        if self.gpulab_options:
            state["gpulab_image"] = self.gpulab_options.image
        if self.held.node:
            state["gpulab_node"] = self.held.node
        if self.held.network:
            state["gpulab_network"] = self.held.network
        return state

    def load_state(self, state):
        super().load_state(state)
        self.held.gpu_ids = list(state.get("gpulab_gpus", []))
        self.held.node = state.get("gpulab_node", "") or self.held.node
        self.held.network = state.get("gpulab_network", "") or self.held.network

    def clear_state(self):
        super().clear_state()
        self.held.gpu_ids = []

    # --- options and the form -----------------------------------------------------------------

    async def apply_notebook_options(self, user_options: dict) -> None:
        """Validate options (form and API alike); JupyterHub answers 400 with our message."""
        try:
            opts = await form.check_options(
                self.settings,
                self.runtime,
                self.ledger,
                self.user.name,
                self._user_groups(),
                user_options,
            )
        except form.OptionsRefused as e:
            raise web.HTTPError(400, "Invalid notebook options: %s", str(e)) from None
        self.gpulab_options = opts
        self.image = opts.image
        self.default_url = opts.default_url
        # JupyterHub gives start() start_timeout seconds: a notebook that may wait for its
        # GPUs in the queue gets that wait on top
        if self._base_start_timeout is None:
            self._base_start_timeout = self.start_timeout
        self.start_timeout = int(self._base_start_timeout + opts.gpu_wait)

    async def render_options_form(self) -> str:
        """JupyterHub awaits an async options_form: the ledger is read off the event loop."""
        return await form.render_form(
            self.settings, self.runtime, self.ledger, self.user.name, self._user_groups()
        )

    # --- progress -----------------------------------------------------------------------------

    def _progress(self, percent: int, message: str) -> None:
        if self._progress_signal is None:
            return  # not starting: nobody reads the spawn page's events
        self._progress_events.append({"progress": percent, "message": message})
        self._progress_signal.set()

    async def progress(self):
        # JupyterHub ends this generator when the spawn ends, so waiting for start() is safe
        while self._progress_events is None:
            await asyncio.sleep(0.1)
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

    # --- the life -----------------------------------------------------------------------------

    @property
    def reconciler(self) -> NotebookReconciler:
        """The hub process's periodic reconciliation (notebooks/reconcile.py), one per
        instance."""
        key = f"{self.settings.instance}|{self.settings.database_url}"
        if key not in self._reconcilers:
            self._reconcilers[key] = NotebookReconciler(
                self.settings, self.records, self.ledger, self.runtime, self.datasets
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
        self._progress_events = []
        self._progress_signal = asyncio.Event()
        self._progress_done = False
        self.reconciler.ensure_running()
        started_at = time.monotonic()
        try:
            with self._in_transit():
                if self.gpulab_options is None:
                    # JupyterHub applies the options before every start (apply_user_options):
                    # a start without them checks them the same way
                    await self.apply_notebook_options(self.user_options)
                nb = self.notebook()
                hub = HubSide(
                    env=self.get_env(),
                    command=list(self.cmd or []),
                    args=self.get_args(),
                    base_url=self.server.base_url,
                    port=self.port,
                    user=self.notebook_user,
                )
                try:
                    ip, port = await life.start(
                        nb, self.gpulab_options, hub, dict(self.user_options or {})
                    )
                finally:
                    self.object_id = self.object_name if self.held.ran else ""
        except NotebookRefused as e:
            raise SpawnFailed(e.status, e.message) from None
        finally:
            self._progress_done = True
            self._progress_signal.set()
        NOTEBOOK_START.observe(time.monotonic() - started_at)  # in the hub's /hub/metrics
        return ip, port

    async def get_object(self) -> WorkloadState | None:
        """What the engine says of the container, as the Runtime tells it (None: there is
        none), never Docker's inspect document: DockerSpawner's readers of that document
        (its start, stop and poll) are overridden here."""
        found = await self.runtime.state(self.object_name)
        self.object_id = "" if found is None else self.object_name
        return found

    async def poll(self):
        """None while the container runs, else how it ended (DockerSpawner's words); an
        ended notebook's record is settled by :func:`~gpulab.notebooks.life.ended`."""
        self.reconciler.ensure_running()
        found = await self.get_object()
        if found is None:
            self.log.warning("Container not found: %s", self.object_name)
            status: int | str = 0
        elif found.running or found.lost:
            # a task on a lost node is the reconciler's to settle (NODE_LOST): until then the
            # hub keeps the server
            return None
        else:
            code = -1 if found.exit_code is None else found.exit_code
            status = f"ExitCode={code}, Error='{found.error}', FinishedAt="
        await life.ended(self.notebook())
        return status

    async def stop(self, now=False):
        try:
            with self._in_transit():
                await life.stop(self.notebook())
        except NotebookRefused as e:
            raise SpawnFailed(e.status, e.message) from None
        finally:
            self.object_id = ""
            self.clear_state()
            # the next start's spawn page waits for that start's events, not this one's
            self._progress_events, self._progress_signal, self._progress_done = None, None, False

    async def delete_forever(self):
        """A named server deleted for good: its remote workspace, container, volumes and GPUs."""
        with self._in_transit():
            done = await life.delete(self.notebook())
        if done:
            # Spawner.delete_forever "can be async": DockerSpawner's is a plain method
            await maybe_future(super().delete_forever())


__all__ = ["NotebookSpawner", "SpawnFailed", "__version__", "report_at_hub_start"]
