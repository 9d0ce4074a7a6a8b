"""A notebook's life, step by step: start (limits and record, GPUs, node, image, data,
container, editor), stop (stop, GPUs, push), delete (purge, container, volumes, GPUs), and a
user's retry of a failed push (:func:`push_again`).

The spawner's hooks hand off here with a :class:`Notebook`: everything one notebook needs
(its names, the configuration, the records, the ledger, the :class:`~gpulab.runtime.base.Runtime`)
and what it holds between calls (:class:`Held`: its GPUs, node, network, whether it ran).
A refusal is a :class:`NotebookRefused` whose message is what the user sees; the record says
the same (FAILED, ERROR, or nothing when the start was refused before it began).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from .. import imagerefs
from ..data.datasets import DatasetCache
from ..data.sync import DiskAccount, SyncOutcome, progress_message
from ..disk_ledger import DiskLedger
from ..durations import format_duration
from ..gpus.inventory import node_of
from ..gpus.ledger import GpuLedger, GpuQuotaExceeded, NoGpuAvailable
from ..gpus.placement import Want
from ..gpus.recent_usage import RecentUsage
from ..gpus.sharing import is_fraction
from ..gpus.waits import GpuWaits
from ..lifecycle import InvalidTransition, NotebookState, utcnow
from ..names import (
    L_NETWORK,
    home_volume_name,
    notebook_workload_id,
)
from ..resources import format_memory
from ..runtime import EngineError
from ..runtime.base import (
    ImagePullFailed,
    NetworkUnavailable,
    PullProgress,
    Runtime,
    WorkloadGone,
)
from ..secrets import SecretMissing, SecretStore, SecretsUnavailable
from .container import ContainerPolicy, HubSide, notebook_mounts, notebook_spec
from .data import HOME_LABEL, NotebookData, PushRaced, recorded_volume_specs, retry_push
from .options import NotebookOptions
from .records import LimitExceeded, NotebookRecords

S = NotebookState
log = logging.getLogger("gpulab.notebooks")

#: the database's thread pool (its calls block): the engine's calls have the Runtime's own
_db_pool = ThreadPoolExecutor(16, thread_name_prefix="gpulab-notebook-db")


class NotebookRefused(Exception):
    """A start, stop or delete that cannot go on: ``status`` (HTTP) and the user's message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Held:
    """What a notebook holds between the spawner's calls (kept in the hub's spawner state)."""

    gpu_ids: list[str] = field(default_factory=list)
    node: str = ""  # "" on one host
    network: str = ""  # the network ID it joined ("": the engine's default)
    #: a container was created for it (it may have written data)
    ran: bool = False
    #: nothing to push at the stop (a pull failed or was refused)
    skip_push: bool = False


@dataclass
class Notebook:
    """One notebook, and everything its life is handed."""

    settings: Any  # GpulabSettings
    runtime: Runtime
    records: NotebookRecords
    ledger: GpuLedger
    disk_ledger: DiskLedger
    user: str
    server: str
    groups: list[str]
    workload_id: str
    container: str
    volume: str
    #: the URL path its server answers under (the hub's proxy routes it there)
    url_path: str
    held: Held
    #: progress(percent, message): what the spawn page shows
    progress: Callable[[int, str], None] = lambda percent, message: None
    options: NotebookOptions | None = None
    #: seconds the editor has to answer, and between two checks
    http_timeout: float = 30.0
    editor_wait_interval: float = 0.05
    #: why the engine cannot hand out GPUs (asked at the hub's start-up): GPU notebooks are
    #: refused with it rather than started without the GPUs the ledger books
    gpu_refusal: str | None = None
    #: the users' secrets (an image's pull secret is revealed at its start only)
    secrets: SecretStore | None = None
    #: the reference its container runs: an image from a registry pinned to its digest
    #: ("": the options' image as the engine names it)
    run_image: str = ""
    #: the nodes' dataset caches, shared with jobs (None: its read-only volumes are its own)
    datasets: DatasetCache | None = None

    async def db(self, fn, *args, **kwargs):
        """A blocking database call, off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_db_pool, partial(fn, *args, **kwargs))

    def image(self, image: str) -> str:
        """The name the engine runs ``image`` by (a Swarm's nodes pull it from the registry)."""
        return self.runtime.image_ref(image)

    def data(self, specs: list[str]) -> NotebookData:
        s = self.settings
        disk = DiskAccount(
            self.disk_ledger, lambda: (self.user, s.disk_quota_for(self.user, self.groups))
        )
        return NotebookData.of(
            s,
            self.runtime,
            self.container,
            self.user,
            self.server,
            self.workload_id,
            specs,
            self.held.node,
            disk,
        )

    @property
    def isolated(self) -> bool:
        return self.settings.network_isolation == "user"

    async def record(self, state: NotebookState, **kw) -> None:
        """Record a transition; a refused one is logged, never allowed to break a spawn."""
        try:
            await self.db(self.records.transition, self.user, self.server, state, **kw)
        except InvalidTransition as e:
            log.warning("%s/%s: not recorded: %s", self.user, self.server, e)

    async def fail(self, state, reason: str, message: str, status: int, exit_code=None):
        """Record the failure, show it, and refuse."""
        log.error("%s/%s: %s: %s", self.user, self.server, reason, message)
        self.progress(100, f"{state.value}: {message}")
        await self.record(state, reason=reason, message=message, exit_code=exit_code)
        return NotebookRefused(status, message)

    def refuse(self, status: int, message: str) -> NotebookRefused:
        """Refused before anything was recorded."""
        self.progress(100, f"FAILED: {message}")
        return NotebookRefused(status, message)


def policy_of(s) -> ContainerPolicy:
    return ContainerPolicy(
        instance=s.instance,
        workspace_dir=s.workspace_dir,
        pids_limit=s.pids_limit,
        shm_fraction=s.shm_fraction,
        activity_report_interval=s.activity_report_interval,
        log_max_size=s.container_log_max_size,
        log_max_files=s.container_log_max_files,
        isolated=s.network_isolation == "user",
    )


# --- start --------------------------------------------------------------------------------


async def start(nb: Notebook, opts: NotebookOptions, hub: HubSide, user_options: dict):
    """Start the notebook; returns (ip, port) at which the hub reaches its server."""
    nb.options = opts
    res = opts.resources
    summary = (
        f"{opts.framework} {opts.version} with {opts.editor}; "
        f"{res.cpus:g} CPU, {format_memory(res.memory)}, {res.gpus:g} GPU"
    )
    before = await nb.db(nb.records.get, nb.user, nb.server) or {}
    await _push_left_on_node(nb, before)
    await _open_record(nb, opts, summary, user_options)
    nb.progress(5, f"Options validated: {summary}")
    await _reserve_gpus(nb, res)
    if opts.image_pull_policy:
        nb.run_image = await _fetch_image(nb, opts)
    else:
        await _check_image(nb, opts.image)
    data = nb.data([str(v) for v in opts.volumes])
    try:
        await _pull(nb, data)
        note = home_not_saved(before)
        if note and data.home is not None:
            nb.progress(55, f"Your home was not saved at the last stop: {note}")
        ip, port = await _run_container(nb, opts, hub, data)
    finally:  # its container holds its dataset copies now, or it will not start
        if nb.datasets is not None:
            await nb.datasets.release(nb.workload_id)
    nb.progress(80, f"Waiting for {opts.editor} to answer")
    await _wait_for_editor(nb, ip, port, hub.base_url)
    await nb.record(S.RUNNING, reason="READY", message=f"{opts.editor} answers")
    nb.progress(100, f"{opts.editor} is ready")
    return ip, port


def home_not_saved(record: dict) -> str:
    """What the record's last stop said of a home that was over its cap ("" if nothing)."""
    history = record.get("history") or [{}]
    message = str(history[-1].get("message") or "")
    _, found, rest = message.partition(f"{HOME_LABEL} not saved: ")
    return rest if found else ""


async def _push_left_on_node(nb: Notebook, record: dict) -> None:
    """A notebook whose last push failed on a cluster keeps that data in its volume on the
    node it ran on. It is pushed from there first (as a push retry), so that the start,
    wherever it is placed, pulls it; if the push still fails, the start is refused and the
    record stays SYNC_FAILED. (On one host the volume is where the next start runs.)"""
    if record.get("state") != S.SYNC_FAILED.value or not record.get("node"):
        return
    nb.held.node = record["node"]
    nb.progress(3, f"Pushing what its last stop left on node {nb.held.node}")
    data = nb.data(recorded_volume_specs(record))
    try:
        why = "pushed before a start, which may run on another node"
        ok, message, _ = await retry_push(nb.records, data, nb.user, nb.server, why)
    except PushRaced:
        msg = "this notebook is busy (a push retry); try again once it has stopped"
        raise NotebookRefused(409, msg) from None
    if not ok:
        msg = f"its last push failed, and fails again from node {nb.held.node}: {message}"
        raise nb.refuse(409, msg)


async def _open_record(nb: Notebook, opts, summary: str, user_options: dict) -> None:
    """The limits (with what the user already runs) and the record, in one transaction."""
    s = nb.settings
    try:
        await nb.db(
            nb.records.start,
            nb.user,
            nb.server,
            opts.resources,
            s.limits_for(nb.user, nb.groups),
            reason="SPAWN",
            message=summary,
            options=opts.to_json(),
            user_options=dict(user_options or {}),
            container=nb.container,
        )
    except LimitExceeded as e:
        raise nb.refuse(409, str(e)) from None
    except InvalidTransition as e:
        # the record is busy elsewhere (a push retry is STOPPING it): starting now would
        # skip the limits and race that push
        msg = f"this notebook is busy ({e}); try again once it has stopped"
        raise nb.refuse(409, msg) from None


#: seconds between two looks of a waiting spawn at its row (or, for a share of a GPU, at the
#: ledger)
GPU_WAIT_POLL = 1.0


async def wait_for_gpus(nb: Notebook, count: float, limit: float, why: str) -> list[str]:
    """Wait up to ``limit`` seconds for ``count`` GPUs (gpus/waits.py): whole GPUs in the
    queue shared with jobs, where the job supervisor books them when the notebook's turn
    comes and says its place in line (shown as the spawn's progress); a share of a GPU by
    asking the ledger again at each look (shares are notebooks' alone: no job takes a slot).
    The wait ends FAILED ``NO_GPU_AVAILABLE`` after ``limit``; cancelled (the server stopped
    while it waits), it leaves no row and no GPU booked behind."""
    s = nb.settings
    waits = GpuWaits(nb.ledger.db, nb.ledger.instance)
    whole = not is_fraction(count)
    deadline = time.monotonic() + limit
    want = _want(nb)
    row_of = (want.model, want.pool)  # what its queue row waits for
    what = f"{count:g} GPU(s)" if whole else f"a {count:g} share of a GPU"
    what += want.text()
    said = ""
    try:
        # its row is written inside the try: a cancellation that comes up at this write's
        # await (the row written, the spawn not yet on) takes the row away too
        if whole:
            until = utcnow() + timedelta(seconds=limit)
            await nb.db(waits.add, nb.workload_id, nb.user, nb.groups, int(count), until, *row_of)
        nb.progress(15, f"{why}: waiting for {what} for up to {format_duration(round(limit, 1))}")
        while True:
            if whole:
                row = await nb.db(waits.get, nb.workload_id)
                if row is None:
                    msg = "the wait for GPUs was cancelled (its queue entry was removed)"
                    raise await nb.fail(S.FAILED, "NO_GPU_AVAILABLE", msg, 409)
                if row["granted"]:
                    held = await nb.db(nb.ledger.held_by, nb.workload_id)
                    if len(held) == int(count) and _gives(nb, want, held):
                        await nb.db(waits.remove, nb.workload_id)
                        return held
                    # a grant meant for an earlier spawn of this server that gave up (what it
                    # booked was released, or is of another model or pool): wait again, in
                    # its place, with nothing of it held
                    log.warning("%s: a stale grant; waiting again", nb.workload_id)
                    await nb.db(nb.ledger.release, nb.workload_id)
                    remaining = max(1.0, deadline - time.monotonic())
                    until = utcnow() + timedelta(seconds=remaining)
                    await nb.db(
                        waits.add, nb.workload_id, nb.user, nb.groups, int(count), until, *row_of
                    )
                    continue
                if row["message"] and row["message"] != said:
                    said = row["message"]
                    nb.progress(15, said[:1].upper() + said[1:])
            else:
                try:
                    return await nb.db(
                        nb.ledger.reserve,
                        nb.workload_id,
                        nb.user,
                        "notebook",
                        count,
                        quota=s.gpu_quota_for(nb.user, nb.groups),
                        want=want,
                    )
                except NoGpuAvailable:
                    pass
            if time.monotonic() >= deadline:
                msg = (
                    f"waited {format_duration(round(limit, 1))} for {what} and none came free "
                    "(the wait limit: the flavor's gpu_wait or notebook_gpu_wait); try again "
                    "later, or ask for fewer GPUs"
                )
                raise await nb.fail(S.FAILED, "NO_GPU_AVAILABLE", msg, 409)
            await asyncio.sleep(GPU_WAIT_POLL)
    except BaseException:
        # given up (the limit, a cancellation, a fault): no row, and nothing a grant booked
        # meanwhile, is left behind; plain calls, so that a cancellation cannot skip them
        if whole:
            with contextlib.suppress(Exception):
                waits.remove(nb.workload_id)
            with contextlib.suppress(Exception):
                nb.ledger.release(nb.workload_id)
        raise


def _gives(nb: Notebook, want: Want, held: list[str]) -> bool:
    """Whether the devices ``held`` are of the model and pool ``want`` asks for."""
    if not want:
        return True
    mine = {d.key for d in nb.ledger.wanted(want)}
    return all(key in mine for key in held)


def _want(nb: Notebook) -> Want:
    """The GPU model and node pool its options ask for."""
    opts = nb.options
    return Want(opts.gpu_model, opts.node_pool) if opts is not None else Want()


def _line_waits(nb: Notebook) -> bool:
    """Whether notebooks wait in line for whole GPUs now (blocking)."""
    return GpuWaits(nb.ledger.db, nb.ledger.instance).anyone_waiting()


async def _reserve_gpus(nb: Notebook, res) -> None:
    """GPUs from the ledger (with the user's quota), then the node: where the GPUs are; for a
    CPU notebook on a cluster, the one the placement policy picks."""
    s = nb.settings
    if res.gpus and nb.gpu_refusal:
        msg = f"this host cannot give containers GPUs: {nb.gpu_refusal}"
        raise await nb.fail(S.ERROR, "GPU_RUNTIME_MISSING", msg, 503)
    nb.progress(15, f"Reserving {res.gpus:g} GPU(s)" if res.gpus else "No GPU requested")
    try:
        await nb.ledger.refresh(nb.runtime)  # a cluster's nodes and devices now
    except EngineError as e:
        msg = f"the container engine did not answer: {e}"
        err = await nb.fail(S.ERROR, "ENGINE_UNREACHABLE", f"container engine error: {e}", 503)
        raise NotebookRefused(err.status, msg) from None
    want = _want(nb)
    why = nb.ledger.want_refusal(want, res.gpus) if want else None
    if why:  # no node could ever give it (one host's options were checked before already)
        option = "gpus" if why[0] in ("resources.gpus", "workers") else why[0]
        msg = why[1] if why[1].startswith(f"{option}: ") else f"{option}: {why[1]}"
        raise await nb.fail(S.FAILED, "NO_GPU_AVAILABLE", msg, 400)
    limit = nb.options.gpu_wait if nb.options is not None else 0.0
    # others waiting in line for whole GPUs: a new spawn goes behind them, never past them
    # (its booking below still checks the quota and the count, then is given back)
    queue_first = (
        limit > 0
        and res.gpus > 0
        and not is_fraction(res.gpus)
        and not await nb.db(nb.ledger.held_by, nb.workload_id)
        and await nb.db(_line_waits, nb)
    )
    try:
        nb.held.gpu_ids = await nb.db(
            nb.ledger.reserve,
            nb.workload_id,
            nb.user,
            "notebook",
            res.gpus,
            quota=s.gpu_quota_for(nb.user, nb.groups),
            want=want,
        )
        if queue_first:
            await nb.db(nb.ledger.release, nb.workload_id)
            nb.held.gpu_ids = []
            why = "other notebooks wait in line for GPUs"
            nb.held.gpu_ids = await wait_for_gpus(nb, res.gpus, limit, why)
    except GpuQuotaExceeded as e:
        raise await nb.fail(S.FAILED, "GPU_QUOTA_EXCEEDED", str(e), 409) from None
    except NoGpuAvailable as e:
        if limit <= 0 or not nb.ledger.could_fit(res.gpus, want):  # nothing worth waiting for
            raise await nb.fail(S.FAILED, "NO_GPU_AVAILABLE", str(e), 409) from None
        nb.held.gpu_ids = await wait_for_gpus(nb, res.gpus, limit, str(e))
    if nb.held.gpu_ids:
        # the fair share counts this notebook's GPUs towards the user's groups too
        recent = RecentUsage(nb.ledger.db, nb.ledger.instance)
        try:
            await nb.db(recent.note_groups, nb.user, nb.groups)
        except Exception:  # never a reason to refuse the spawn
            log.warning("%s: the fair share did not note its groups", nb.workload_id, exc_info=True)
        share = f" ({res.gpus:g} of it, shared)" if is_fraction(res.gpus) else ""
        nb.progress(20, f"GPUs reserved: {', '.join(nb.held.gpu_ids)}{share}")
    if nb.ledger.clustered:
        await _place(nb)


async def _place(nb: Notebook) -> None:
    """On a cluster: the node it runs on, recorded with the notebook, since its volumes live
    there."""
    s = nb.settings
    ws = s.storage.workspace
    if ws is None or s.storage.stores[ws.store].kind != "s3":
        msg = (
            "on a Swarm the workspace must live in an S3 store (the admin sets "
            "c.GpulabSettings.workspace_store), so that it follows the notebook between nodes"
        )
        raise await nb.fail(S.ERROR, "CONFIG", msg, 503)
    if not nb.ledger.nodes:
        msg = "no node of the cluster takes workloads now (all down or drained)"
        raise await nb.fail(S.ERROR, "NO_NODE", msg, 503)
    if nb.held.gpu_ids:
        nb.held.node = node_of(nb.held.gpu_ids[0])
    else:
        nb.held.node = await nb.db(nb.ledger.node_for_cpu, _want(nb))
    await nb.db(nb.records.set_node, nb.user, nb.server, nb.held.node)
    nb.progress(25, f"Placed on node {nb.held.node}")


async def _check_image(nb: Notebook, image: str) -> None:
    nb.progress(30, f"Preparing image {image}")
    try:
        present = await nb.runtime.image_exists(nb.image(image))
    except EngineError as e:
        msg = f"the container engine did not answer: {e}"
        err = await nb.fail(S.ERROR, "ENGINE_UNREACHABLE", f"container engine error: {e}", 503)
        raise NotebookRefused(err.status, msg) from None
    if not present:
        where = nb.runtime.images_at
        msg = f"image {nb.image(image)} is missing {where} (the admin builds it: make images)"
        raise await nb.fail(S.ERROR, "IMAGE_MISSING", msg, 503)


#: what a notebook's image must run: JupyterHub's single-user server (JupyterLab and VS Code
#: are both served by it)
SINGLE_USER = "jupyterhub-singleuser"


async def _fetch_image(nb: Notebook, opts: NotebookOptions) -> str:
    """An image from a registry: the registry asked for its digest with the user's own
    credentials (at every start, whatever the policy), pulled as the policy says with its
    bytes in the progress, then checked for what a notebook needs. The pinned reference."""
    s = nb.settings
    ref = imagerefs.parse(opts.image)
    if not imagerefs.allowed(ref, s.image_registries):  # taken off since the options were read
        msg = f"image {opts.image} is from a registry this site does not allow"
        raise await nb.fail(S.FAILED, "IMAGE_NOT_ALLOWED", msg, 403)
    auth = None
    if opts.image_pull_secret:
        name = opts.image_pull_secret
        try:
            if nb.secrets is None:
                raise SecretsUnavailable("secrets are not enabled on this platform")
            value = await nb.db(nb.secrets.reveal, nb.user, name)
            auth = imagerefs.registry_auth(value, ref.registry)
        except SecretMissing:
            msg = (
                f"image_pull_secret: you have no secret {name!r}: create it with "
                f"`gpulab secret set {name}`"
            )
            raise await nb.fail(S.FAILED, "SECRET_MISSING", msg, 400) from None
        except SecretsUnavailable as e:
            raise await nb.fail(S.ERROR, "SECRET_MISSING", str(e), 503) from None
        except imagerefs.ImageRefError as e:
            msg = f"image_pull_secret: secret {name!r}: {e}"
            raise await nb.fail(S.FAILED, "IMAGE_PULL_FAILED", msg, 400) from None
    nb.progress(30, f"Asking the registry for image {opts.image}")
    shown = {"at": 0.0}

    def on_progress(p: PullProgress) -> None:
        now = time.monotonic()
        if now - shown["at"] >= 1.0:
            shown["at"] = now
            nb.progress(32, p.line(opts.image))

    try:
        pinned = await asyncio.wait_for(
            nb.runtime.fetch_image(
                opts.image,
                opts.image_pull_policy or "",
                auth,
                on_progress,
                nb.held.node,
                s.image_max_size,
            ),
            s.image_pull_timeout,
        )
    except ImagePullFailed as e:
        msg = f"image {opts.image}: {e}"
        raise await nb.fail(S.FAILED, "IMAGE_PULL_FAILED", msg, 400) from None
    except TimeoutError:
        msg = f"image {opts.image} was not pulled within {s.image_pull_timeout:g} s"
        raise await nb.fail(S.FAILED, "IMAGE_PULL_FAILED", msg, 504) from None
    except EngineError as e:
        msg = f"the container engine did not answer: {e}"
        raise await nb.fail(S.ERROR, "ENGINE_UNREACHABLE", msg, 503) from None
    nb.progress(34, f"Image {pinned} is here")
    return pinned


def _unsuitable(nb: Notebook, text: str, code: int | None) -> str | None:
    """Why an image from a registry cannot run a notebook, when its start says so (the engine
    found no such program, or the shell's 127): gpulab runs nothing of a pulled image but the
    notebook itself, with its limits, rather than a separate check of its own."""
    opts = nb.options
    if opts is None or not opts.image_pull_policy:
        return None
    if code == 127 or "executable file not found" in text or "no such file" in text.lower():
        return (
            f"image {opts.image} cannot run a notebook: it has no {SINGLE_USER} on its PATH "
            "(install jupyterhub and jupyterlab in it, as gpulab's images do)"
        )
    return None


async def _pull(nb: Notebook, data: NotebookData) -> None:
    """Pull the workspace and the volumes from object storage."""
    s = nb.settings
    nb.held.skip_push = False
    if not data.volumes:
        nb.progress(45, f"Workspace {s.workspace_dir} is a local volume (no object store)")
        return
    if not await nb.runtime.image_exists(nb.image(s.sync_image)):
        msg = f"sync helper image {s.sync_image} is missing (the admin builds it: make images)"
        raise await nb.fail(S.ERROR, "IMAGE_MISSING", msg, 503)
    for i, vol in enumerate(list(data.volumes)):
        store = vol.spec.store
        # the image's /workspace (uid 1000) and home populate a new volume; on a cluster
        # the pull always runs: the node may hold an older copy of a notebook that ran
        # elsewhere since (its volume exists, and is out of date)
        skip = not vol.node and await data.sync.nothing_to_pull(
            vol, image_provides_mount=vol.label in ("workspace", HOME_LABEL)
        )
        if skip:
            nb.progress(45, f"{vol.label}: nothing stored yet in object store {store}")
            continue
        nb.progress(40, f"Pulling {vol.label} from object store {store}")

        def on_progress(p: dict, label=vol.label) -> None:
            nb.progress(45, progress_message("Pulling", label, p))

        outcome = None
        if _cacheable(nb, vol):
            # the owner's quota counts the dataset as if the notebook had a copy of its own
            booked = await data.sync.book_pull(vol)
            if isinstance(booked, SyncOutcome):
                outcome = booked  # refused by the quota (or not listed): as without the cache
            else:
                shared, outcome = await nb.datasets.volume_for(
                    nb.user, nb.workload_id, vol, on_progress
                )
                if shared is not None:  # mounted read-only from the node's copy
                    data.volumes[i] = shared
                    data.cached.append(shared)
                    nb.progress(50, _cache_note(vol, shared, outcome))
                    continue
        if outcome is None:
            outcome = await data.sync.run("pull", vol, on_progress)
        if outcome.refused:  # the disk quota: nothing was fetched, nothing to push
            nb.held.skip_push = True
            raise await nb.fail(S.FAILED, "PULL_FAILED", outcome.reason, 403)
        if not outcome.ok:
            nb.held.skip_push = True  # nothing to push from a half-pulled start
            msg = f"pull of volume {vol.label} failed: {outcome.reason}"
            raise await nb.fail(S.FAILED, "PULL_FAILED", msg, 500)
        nb.progress(50, "Pulled " + outcome.summary())


def _cacheable(nb: Notebook, vol) -> bool:
    """A read-only volume of the user's that the nodes' dataset cache may hold."""
    return (
        nb.datasets is not None
        and vol.spec.mode == "ro"
        and vol.label not in ("workspace", HOME_LABEL)
        and bool(nb.settings.dataset_cache_max_size)
    )


def _cache_note(vol, shared, outcome: SyncOutcome | None) -> str:
    if outcome is None:
        return f"{vol.label}: the node's copy in the dataset cache ({shared.docker_volume})"
    return f"Pulled {outcome.summary()} into the node's dataset cache ({shared.docker_volume})"


async def _run_container(nb: Notebook, opts, hub: HubSide, data: NotebookData):
    """Create and start the container on the user's network (only theirs); (ip, port) at
    which the hub reaches it. A process that dies at once is the notebook's FAILED (with
    its exit code), an engine that refuses it a platform ERROR."""
    s = nb.settings
    try:
        nb.held.network = (
            await nb.runtime.ensure_user_network(s.instance, nb.user) if nb.isolated else ""
        )
    except (NetworkUnavailable, EngineError) as e:
        raise await nb.fail(S.ERROR, "NETWORK_UNAVAILABLE", str(e), 503) from None
    image = nb.run_image or nb.image(opts.image)
    try:
        image_command = None if hub.command else await nb.runtime.image_command(image)
    except EngineError as e:
        msg = f"the engine could not start the container: {e}"
        raise await nb.fail(S.ERROR, "ENGINE_ERROR", msg, 503) from None
    spec = notebook_spec(
        policy=policy_of(s),
        hub=hub,
        name=nb.container,
        image=image,
        image_command=image_command,
        user=nb.user,
        server=nb.server,
        workload_id=nb.workload_id,
        resources=opts.resources,
        gpu_ids=nb.held.gpu_ids,
        mounts=notebook_mounts(
            nb.volume,
            s.workspace_dir,
            [
                (v.docker_volume, v.spec.mount, v.spec.mode == "ro")
                for v in data.volumes
                if v.label not in ("workspace", HOME_LABEL)
            ],
            (home_volume_name(nb.container), s.home_dir) if s.home_sync else None,
            frozenset(v.docker_volume for v in data.volumes if v in data.cached),
        ),
        network_id=nb.held.network,
        node=nb.held.node,
    )
    nb.progress(60, "Starting the container")
    try:
        await nb.runtime.create_and_start(spec)
    except (NetworkUnavailable, EngineError) as e:
        # created but not started (e.g. "could not select device driver"): it is kept, for
        # its configuration, until the stop
        nb.held.ran = await _exists(nb)
        why = e.detail
        unsuitable = _unsuitable(nb, f"{why} {e}", None)
        if unsuitable:
            raise await nb.fail(S.FAILED, "IMAGE_UNSUITABLE", unsuitable, 400) from None
        msg = f"the engine could not start the container: {why}"
        raise await nb.fail(S.ERROR, "ENGINE_ERROR", msg, 503) from None
    nb.held.ran = True
    nb.held.network = spec.labels.get(L_NETWORK, "") or nb.held.network
    try:
        return await nb.runtime.reach(nb.container, nb.held.network, hub.base_url, hub.port)
    except (WorkloadGone, EngineError) as e:
        exited = await exit_status(nb)
        if exited is not None and exited[0] != -1:
            unsuitable = _unsuitable(nb, exited[1], exited[0])
            if unsuitable:
                raise await nb.fail(
                    S.FAILED, "IMAGE_UNSUITABLE", unsuitable, 400, exit_code=exited[0]
                ) from None
            raise await nb.fail(S.FAILED, "EXITED", exited[1], 500, exit_code=exited[0]) from None
        msg = f"the engine could not start the container: {e}"
        raise await nb.fail(S.ERROR, "ENGINE_ERROR", msg, 503) from None


async def _exists(nb: Notebook) -> bool:
    try:
        return await nb.runtime.state(nb.container) is not None
    except EngineError:
        return False


async def editor_answers(url: str) -> bool:
    """The notebook's server answers at ``url``: any HTTP answer below 500 means it is up."""
    try:
        await AsyncHTTPClient().fetch(url, request_timeout=2, connect_timeout=1)
        return True
    except HTTPClientError as e:
        return e.code < 500 and e.code != 599
    except OSError:
        return False


async def _wait_for_editor(nb: Notebook, ip: str, port: int, base_url: str) -> None:
    url = f"http://{ip}:{port}{base_url}api"
    deadline = time.monotonic() + nb.http_timeout
    last_check = 0.0
    while time.monotonic() < deadline:
        if await editor_answers(url):
            return
        if time.monotonic() - last_check > 0.5:
            last_check = time.monotonic()
            exited = await exit_status(nb)
            if exited is not None:
                code, msg = exited
                unsuitable = _unsuitable(nb, msg, code)
                if unsuitable:
                    raise await nb.fail(
                        S.FAILED, "IMAGE_UNSUITABLE", unsuitable, 400, exit_code=code
                    )
                raise await nb.fail(S.FAILED, "EXITED", msg, 500, exit_code=code)
        await asyncio.sleep(nb.editor_wait_interval)
    msg = f"the editor did not answer within {nb.http_timeout:g} s"
    raise await nb.fail(S.FAILED, "READY_TIMEOUT", msg, 500)


async def exit_status(nb: Notebook) -> tuple[int, str] | None:
    """(exit code, explanation) if the container has stopped, else None."""
    found = await nb.runtime.state(nb.container)
    if found is None:
        return (-1, "the notebook container vanished")
    if found.running:
        return None
    code = -1 if found.exit_code is None else found.exit_code
    if found.oom:
        limit = nb.options.resources.memory if nb.options else 0
        why = f"killed: out of memory (limit {format_memory(limit)})"
    else:
        why = found.error or "the notebook process exited"
    return (code, f"{why} (exit code {code})")


async def ended(nb: Notebook) -> None:
    """The hub found the container stopped: a RUNNING notebook whose process exited with an
    error is FAILED, with its exit code."""
    if await nb.db(nb.records.state, nb.user, nb.server) is S.RUNNING:
        exited = await exit_status(nb)
        if exited and exited[0] != 0:
            await nb.record(S.FAILED, reason="EXITED", message=exited[1], exit_code=exited[0])


# --- stop ---------------------------------------------------------------------------------


async def stop(nb: Notebook) -> None:
    """Stop the container; GPUs go back once the engine confirms it runs nothing; then the
    push (a failure keeps every local byte: SYNC_FAILED)."""
    record = await nb.db(nb.records.get, nb.user, nb.server) or {}
    current = S(record["state"]) if record.get("state") else None
    ran = nb.held.ran  # a notebook container existed: it may have written data
    # a start refused before any container (limits, a push that still fails) leaves an
    # ended record as it was: a SYNC_FAILED one keeps saying that its data waits
    is_ended = current in (S.FAILED, S.ERROR) or (current in (S.SYNC_FAILED, S.STOPPED) and not ran)
    last = ((record.get("history") or [{}])[-1]).get("reason", "")
    nb.held.node = record.get("node") or nb.held.node  # a cluster: where its volumes are
    if last == "NODE_LOST":
        # its volumes went with the node: nothing can be pushed (the reconciler said so)
        ran = False
    if not is_ended:
        reason, message = await nb.db(nb.records.take_stop_reason, nb.user, nb.server)
        await nb.record(S.STOPPING, reason=reason, message=message)
    try:
        await nb.runtime.stop(nb.container, 10)
        if not (is_ended and nb.held.ran):
            # a failed container is kept (stopped) for its logs and configuration; the next
            # start or a delete removes it
            await nb.runtime.remove(nb.container)
            await nb.runtime.unreach(nb.url_path)
    except EngineError as e:
        log.error("%s/%s: could not stop: %s; killing it", nb.user, nb.server, e)
        with contextlib.suppress(Exception):  # the check below decides
            await nb.runtime.kill(nb.container)
    nb.held.ran = False
    # GPUs go back only once the engine confirms that the container runs nothing; if it
    # does not, the record stays STOPPING with its GPUs, and the reconciler stops the
    # container and settles the record once the engine answers (notebooks/reconcile.py)
    found = await nb.runtime.state(nb.container)
    if found is not None and found.running:
        raise NotebookRefused(503, f"notebook container {nb.container} still runs")
    released = await nb.db(nb.ledger.release, nb.workload_id)
    if released:
        log.info("%s/%s released GPUs %s", nb.user, nb.server, ", ".join(released))
    nb.held.gpu_ids = []

    # push the workspace and writable volumes; a failure keeps every local byte
    ok, message = True, "compute released"
    if ran and not nb.held.skip_push:
        ok, message = await nb.data(recorded_volume_specs(record)).push()
    if not ok:
        await nb.record(S.SYNC_FAILED, reason="PUSH_FAILED", message=message)
    elif not is_ended:
        await nb.record(S.STOPPED, reason="STOPPED", message=message)
    await release_network(nb)  # after the outcome is recorded (about 0.2 s)


async def release_network(nb: Notebook) -> None:
    """Best effort: the user's network goes with their last container (address pools)."""
    if not nb.isolated:
        return
    try:
        await nb.runtime.remove_user_network_if_unused(nb.settings.instance, nb.user)
    except EngineError as e:
        log.warning("%s/%s: network not removed: %s", nb.user, nb.server, e)


# --- delete -------------------------------------------------------------------------------


async def delete(nb: Notebook) -> bool:
    """Deleted for good: its remote workspace, container, volumes, GPUs and disk bookings.
    False: the remote workspace could not be purged (the record says ERROR, the local copy
    stays)."""
    await nb.record(S.DELETING, reason="DELETE", message="notebook deleted by its owner")
    record = await nb.db(nb.records.get, nb.user, nb.server) or {}
    nb.held.node = record.get("node") or nb.held.node  # a cluster: where its volumes are
    data = nb.data(recorded_volume_specs(record))
    outcome = await data.purge_workspace()
    if outcome is not None and not outcome.ok:
        msg = f"could not delete the remote workspace: {outcome.reason}; local copy kept"
        await nb.record(S.ERROR, reason="DELETE_FAILED", message=msg)
        return False
    try:
        await nb.runtime.remove(nb.container)
        await nb.runtime.unreach(nb.url_path)
        home = [home_volume_name(nb.container)] if nb.settings.home_sync else []
        for name in {nb.volume, *home, *(v.docker_volume for v in data.volumes)}:
            await nb.runtime.remove_volume(name, nb.held.node)
        await nb.db(nb.ledger.release, nb.workload_id)
        await nb.db(nb.disk_ledger.release_workload, nb.workload_id)
    except EngineError as e:
        await nb.record(S.ERROR, reason="DELETE_FAILED", message=str(e))
        raise
    await release_network(nb)
    await nb.record(S.DELETED, reason="DELETED", message="workspace and volumes removed")
    return True


# --- a push retried by a user -------------------------------------------------------------


async def push_again(
    settings, runtime: Runtime, records: NotebookRecords, record: dict, by: str
) -> tuple[bool, dict]:
    """Push again, when ``by`` asks, the volumes of the notebook whose record is ``record``
    (only a SYNC_FAILED one's), where the record says it ran: (whether the push succeeded,
    the record after it). A notebook in another state, or one that changed meanwhile (of two
    retries at once, one pushes), is a :class:`NotebookRefused` (409)."""
    if record["state"] != S.SYNC_FAILED.value:
        raise NotebookRefused(
            409,
            f"only a SYNC_FAILED notebook's push can be retried; this one is {record['state']}",
        )
    user, server = record["user"], record["server"]
    workload = notebook_workload_id(settings.instance, user, server)
    data = NotebookData.of_record(settings, runtime, record, workload)
    try:
        ok, _, after = await retry_push(records, data, user, server, f"push retried by {by}")
    except PushRaced as e:
        if e.during:
            raise NotebookRefused(
                409, "this notebook changed during the push: read its state"
            ) from None
        raise NotebookRefused(
            409, "this notebook changed meanwhile (another push retry or a start): try again"
        ) from None
    return ok, after
