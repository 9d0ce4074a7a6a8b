"""Pull and push a workload's workspace and volumes with the sync helper container.

The hub (spawner) and the service (retries, jobs) share this: it resolves a store's credentials
(from the environment or a file named by the admin) and hands them to the short-lived helper
container only, runs ``gpulab-sync`` there against the workload's Docker volume, and turns the
helper's JSON lines into progress callbacks and a report.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..datasync.credentials import (
    Credentials,
    CredentialsError,
    ProfileMissing,
    ca_bundle_problem,
)
from ..datasync.models import tls_refusal
from ..datasync.s3_settings import S3Settings
from ..metrics import observe_sync
from ..names import L_INSTANCE, L_KIND, L_WORKLOAD, home_volume_name, volume_name
from ..runtime.base import HELPER_FILES_DIR, EngineError, Runtime
from ..statelog import register_sensitive
from ..volumes import ObjectStore, VolumeSpec
from .helper import filesystem_store_dirs, sync_helper_spec

if TYPE_CHECKING:
    from ..datasync.s3 import S3Remote
    from ..disk_ledger import DiskLedger

log = logging.getLogger(__name__)

Progress = Callable[[dict], None]

#: threads for the sync's own blocking calls to a store (listing what a pull would bring): a
#: pool of its own, so that a slow or unreachable store (each listing may wait seconds) never
#: holds the Runtime's engine pool, nor the default pool that database calls share
STORE_THREADS = 8
_store_pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="gpulab-store")


async def _listing(fn, *args):
    """A blocking listing of a store, on the sync's own pool."""
    return await asyncio.get_running_loop().run_in_executor(_store_pool, fn, *args)


class StorageCredentialsError(RuntimeError):
    """The admin's credentials for a store cannot be read (a platform fault: ERROR)."""


class StoreLayoutError(RuntimeError):
    """A filesystem store's directory for a volume cannot be mounted safely (a link, or
    something other than a directory, on its path): the sync fails, nothing is mounted."""


#: seconds the final push of a volume waits for a live push of it that is still running
#: (in another process: a notebook's on-demand push in the service, its stop in the hub)
FINAL_PUSH_WAITS_S = 300.0

#: the sync helper's user (see :func:`~gpulab.data.helper.sync_helper_spec`)
HELPER_UID, HELPER_GID = 1000, 100
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _ensure_dir(root_fd: int, rel: str, store: str) -> None:
    """Make ``rel`` below the directory ``root_fd``, one component at a time and without
    following links; directories made are owned by the helper's user, as is ``rel`` itself
    (when this process may change owners). StoreLayoutError if a link or a non-directory is
    on the way."""
    fd = root_fd
    try:
        for i, name in enumerate(rel.split("/")):
            made = False
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    made = True
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                where = "/".join(rel.split("/")[: i + 1])
                raise StoreLayoutError(
                    f"store {store}: {where} is a symbolic link or not a directory on the "
                    "host; refusing to mount it for the sync (an operator must fix it)"
                ) from None
            if fd != root_fd:
                os.close(fd)
            fd = child
            leaf = i == rel.count("/")
            if (made or leaf) and os.geteuid() == 0 and os.fstat(fd).st_uid != HELPER_UID:
                os.fchown(fd, HELPER_UID, HELPER_GID)
    finally:
        if fd != root_fd:
            os.close(fd)


def prepare_store_dirs(store: ObjectStore, spec: VolumeSpec) -> str | None:
    """For a filesystem store: make sure the volume's two directories exist (objects and
    metadata, see :func:`~gpulab.runtime.objects.filesystem_store_dirs`), reached from the
    store root without any link and writable by the helper, and return the root's canonical
    path (what the helper's binds are built from). None for other stores.

    Runs on the host, often as root, before anything is bound into a helper: a link there
    would make Docker bind whatever it points to."""
    if store.kind != "filesystem" or not store.root:
        return None
    root = Path(store.root)
    root.mkdir(parents=True, exist_ok=True)
    real = os.path.realpath(root)
    try:
        dirs = filesystem_store_dirs(spec.bucket, spec.prefix)
    except ValueError as e:
        raise StoreLayoutError(f"store {store.name}: {e}") from None
    root_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for rel in dirs:
            _ensure_dir(root_fd, rel, store.name)
            # belt and braces: what Docker will resolve is exactly the directory checked
            if os.path.realpath(os.path.join(real, rel)) != os.path.join(real, rel):
                raise StoreLayoutError(f"store {store.name}: {rel} resolves outside the store")
    finally:
        os.close(root_fd)
    return real


def store_keys(store: ObjectStore) -> Credentials | None:
    """The store's keys (and session token), read where the admin said they are: a
    credentials file (its profile) or two environment variables. None for a filesystem store.
    """
    if store.kind == "filesystem":
        return None
    src = store.credentials
    if src.file:
        try:
            creds = Credentials.from_file(src.file, src.profile)
        except CredentialsError as e:
            raise StorageCredentialsError(f"store {store.name}: {e}") from None
    else:
        key, secret = os.environ.get(src.access_key_env), os.environ.get(src.secret_key_env)
        if not key or not secret:
            where = f"${src.access_key_env} / ${src.secret_key_env}"
            raise StorageCredentialsError(f"store {store.name}: no credentials in {where}")
        creds = Credentials(key, secret)
    # never in a state change's logged message
    register_sensitive([v for v in astuple(creds) if v])
    return creds


def store_credentials(store: ObjectStore) -> dict[str, str]:
    """The store's keys as the AWS environment variables name them ({} for a filesystem
    store): what ``gpulab doctor`` probes with."""
    creds = store_keys(store)
    if creds is None:
        return {}
    env = {
        "AWS_ACCESS_KEY_ID": creds.access_key_id,
        "AWS_SECRET_ACCESS_KEY": creds.secret_access_key,
    }
    if creds.session_token:
        env["AWS_SESSION_TOKEN"] = creds.session_token
    return env


def store_verify(store: ObjectStore) -> bool | str:
    """How the hub's own S3 clients check the store's TLS certificate: against its CA
    bundle, the system's CAs (True), or not at all (``verify=False``, a lab)."""
    return store.ca_bundle or store.verify


def store_remote(store: ObjectStore, bucket: str, settings: S3Settings) -> S3Remote:
    """An S3 client of ``bucket`` on ``store`` for the hub and the service (listings), with
    the store's keys and its TLS settings."""
    from ..datasync.s3 import S3Remote  # botocore, loaded when a store is first listed

    return S3Remote(
        bucket,
        endpoint_url=store.endpoint_url,
        region=store.region,
        credentials=store_keys(store),
        settings=settings,
        verify=store_verify(store),
    )


#: the names of the store's files in the helper (under ``HELPER_FILES_DIR``)
HELPER_CREDENTIALS, HELPER_CA_BUNDLE = "store-credentials", "store-ca.pem"


def helper_store_files(store: ObjectStore) -> tuple[dict[str, bytes], list[str]]:
    """What the sync helper is handed for ``store``: its secret files (the keys and session
    token as a credentials file, the CA bundle's content) and the arguments that name them.
    Files, never the helper's environment: ``docker inspect`` of a helper shows no key."""
    creds = store_keys(store)
    if creds is None:
        return {}, []
    files = {HELPER_CREDENTIALS: creds.to_file_text().encode()}
    args = ["--credentials-file", f"{HELPER_FILES_DIR}/{HELPER_CREDENTIALS}"]
    if store.ca_bundle:
        try:
            files[HELPER_CA_BUNDLE] = Path(store.ca_bundle).read_bytes()
        except OSError as e:
            raise StorageCredentialsError(
                f"store {store.name}: cannot read its ca_bundle {store.ca_bundle} ({e.strerror})"
            ) from None
        args += ["--ca-bundle", f"{HELPER_FILES_DIR}/{HELPER_CA_BUNDLE}"]
    elif not store.verify:
        args.append("--no-verify-tls")
    return files, args


def check_stores(stores: dict[str, ObjectStore]) -> list[str]:
    """The start-up check of what the stores' configuration names on this host: a
    ``ca_bundle`` that exists and is a PEM CA bundle, a credentials file's ``profile`` that
    the file has. Raises ValueError naming the store and the field; returns warnings (a
    store whose certificate is not verified)."""
    warnings = []
    for store in stores.values():
        if store.ca_bundle:
            problem = ca_bundle_problem(store.ca_bundle)
            if problem:
                raise ValueError(f"object store {store.name!r}: ca_bundle {problem}")
        if not store.verify:
            warnings.append(
                f"object store {store.name!r}: verify=False, its TLS certificate is not "
                "verified (anyone on the path can read and change its data and keys): a lab "
                "setting only; give it a ca_bundle instead"
            )
        src = store.credentials
        if src.file and src.profile and os.access(src.file, os.R_OK):
            try:
                Credentials.from_file(src.file, src.profile)
            except ProfileMissing as e:
                raise ValueError(f"object store {store.name!r}: credentials.profile: {e}") from None
            except CredentialsError:
                pass  # the keys themselves: said at the first sync, and by gpulab doctor
    return warnings


@dataclass
class VolumeSync:
    """One volume of a workload: what it is, which Docker volume holds it, how it is shown."""

    spec: VolumeSpec
    docker_volume: str
    label: str  # "workspace", "home" or the spec as the user wrote it
    node: str = ""  # the node that holds the volume ("" on one host)
    #: paths its sync leaves alone (:mod:`gpulab.datasync.exclude`; a home's caches)
    exclude: tuple[str, ...] = ()
    #: the most its push may send (a home's cap, bytes); over it, nothing is pushed and the
    #: outcome says so (:attr:`SyncOutcome.over_cap`)
    cap: int | None = None
    #: symbolic links kept as links (a home: its venvs and conda environments); elsewhere
    #: they are skipped, as they always were
    links: bool = False

    def to_json(self) -> dict:
        return {"label": self.label, "spec": str(self.spec), "docker_volume": self.docker_volume}


@dataclass
class SyncOutcome:
    volume: VolumeSync
    ok: bool
    report: dict = field(default_factory=dict)
    reason: str = ""
    #: the pull was refused before it began (the owner's disk quota): ``reason`` is the whole
    #: sentence, naming the volume
    refused: bool = False

    @property
    def over_cap(self) -> bool:
        """A push refused from its scan because the volume holds more than its cap: nothing
        was sent or deleted, nothing local touched."""
        return (
            not self.ok
            and self.volume.cap is not None
            and self.report.get("operation") == "push"
            and _over_booking(self.report)
        )

    def summary(self) -> str:
        r = self.report
        if self.over_cap:
            return (
                f"{self.volume.label} not saved: it holds {_cap_words(self.reason)}; its "
                "local copy is kept as it is; make it smaller (its caches are not counted) "
                "and stop again to save it"
            )
        if not self.ok:
            return f"{self.volume.label}: {self.reason}"
        moved = r.get("completed", 0)
        if r.get("live"):  # nothing is deleted; what was in flux waits for the next push
            flux = r.get("in_flux", 0)
            return (
                f"{self.volume.label}: {moved} transferred, "
                f"{r.get('skipped', 0) - flux} unchanged, {flux} in flux, "
                f"{_size(r.get('bytes_transferred', 0))}"
            )
        return (
            f"{self.volume.label}: {moved} transferred, {r.get('skipped', 0)} unchanged, "
            f"{r.get('deleted', 0)} deleted, {_size(r.get('bytes_transferred', 0))}"
        )


@dataclass(frozen=True)
class DiskAccount:
    """The disk bounds of one workload's pulls and clones: the ledger its volumes are booked
    in, its owner and their disk quota (``owner_and_quota``, blocking: called in a thread,
    when a booking is made), and the cap of one git repository (jobs)."""

    ledger: DiskLedger
    owner_and_quota: Callable[[], tuple[str, int | None]]
    git_max_bytes: int | None = None


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _cap_words(reason: str) -> str:
    """The size and the cap a refused push said, without the helper's option name."""
    reason = reason.split(": ", 1)[-1] if reason.startswith("(listing): ") else reason
    return reason.split(" (--max-bytes)")[0]


def progress_message(verb: str, label: str, p: dict) -> str:
    total = p.get("objects_total", 0)
    return (
        f"{verb} {label}: {p.get('processed', 0)}/{total} objects "
        f"({p.get('completed', 0)} transferred, {p.get('skipped', 0)} unchanged, "
        f"{p.get('failed', 0)} failed), {_size(p.get('bytes_transferred', 0))}"
    )


class WorkloadData:
    def __init__(
        self,
        runtime: Runtime,
        stores: dict[str, ObjectStore],
        image: str,
        instance: str,
        workload: str,
        disk: DiskAccount | None = None,
    ):
        self.runtime = runtime
        self.stores = stores
        self.image = image
        self.instance = instance
        self.workload = workload
        #: None: pulls are not booked against any quota (tests of the sync alone)
        self.disk = disk

    def _remote_empty(self, vol: VolumeSync) -> bool:
        """True only when the store certainly holds nothing under the volume's prefix.

        Then a pull has nothing to do, and no helper container is started for it (a new
        workspace costs nothing). Any doubt (an error, an unreadable store) says False: the
        helper runs and reports properly.
        """
        spec, store = vol.spec, self.stores[vol.spec.store]
        prefix = spec.prefix.strip("/")
        if store.kind == "filesystem":
            top = Path(store.root or "/nonexistent") / spec.bucket / prefix
            if not top.exists():
                return True
            return top.is_dir() and not any(p.is_file() for p in top.rglob("*"))
        try:
            quick = S3Settings(max_attempts=1, connect_timeout=3.0, read_timeout=5.0)
            client = store_remote(store, spec.bucket, quick).client
            answer = client.list_objects_v2(
                Bucket=spec.bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1
            )
            return answer.get("KeyCount", 0) == 0
        except Exception as e:
            # no bucket yet: nothing to pull (the push creates it); any other doubt: run the helper
            return type(e).__name__ == "NoSuchBucket"

    async def nothing_to_pull(self, vol: VolumeSync, image_provides_mount: bool = False) -> bool:
        """A pull can be skipped: the store holds nothing for the volume, and its Docker volume
        already exists (or the image's own directory at the mount will populate it), so it does
        not need the helper to create it owned by the workload's user."""
        exists = await self.runtime.volume_exists(vol.docker_volume, vol.node)
        if not (image_provides_mount or exists):
            return False
        return await _listing(self._remote_empty, vol)

    def listed_size(self, vol: VolumeSync) -> int:
        """Bytes of the objects a pull of ``vol`` would bring (their total size under the
        volume's prefix, as the sync engine lists them); 0 for a bucket that does not exist.
        Blocking. Raises on any other failure to list."""
        return sum(o.size for o in self._listed(vol))

    def listed_content(self, vol: VolumeSync) -> tuple[int, str]:
        """(bytes, content key) of what a pull of ``vol`` would bring: the key is a SHA-256
        over every object's key, size and change token (ETag), so that it changes when any
        object under the prefix does. Blocking; raises as :meth:`listed_size`."""
        h = hashlib.sha256()
        size = 0
        for o in sorted(self._listed(vol), key=lambda o: o.key):
            size += o.size
            h.update(f"{o.key}\0{o.size}\0{o.etag}\n".encode())
        return size, h.hexdigest()

    def _listed(self, vol: VolumeSync) -> list:
        from ..datasync.localtree import normalize_prefix

        spec, store = vol.spec, self.stores[vol.spec.store]
        prefix = normalize_prefix(spec.prefix)
        if store.kind == "filesystem":
            from ..datasync.filesystem import FilesystemRemote

            remote = FilesystemRemote(store.root or "/nonexistent", spec.bucket)
            return list(remote.list(prefix))
        from botocore.exceptions import ClientError

        settings = S3Settings(max_attempts=3, connect_timeout=5.0, read_timeout=30.0)
        remote = store_remote(store, spec.bucket, settings)
        try:
            return list(remote.list(prefix))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchBucket", "404"):
                return []
            raise

    async def book_pull(self, vol: VolumeSync) -> SyncOutcome | int:
        """Book what a pull of ``vol`` brings against the owner's disk quota, checked in the
        same transaction: the bytes booked (the helper's ``--max-bytes``), or the outcome of
        a pull refused before it began."""
        from ..disk_ledger import DiskQuotaExceeded
        from ..disk_quota import pull_refusal

        disk = self.disk
        assert disk is not None
        try:
            size = await _listing(self.listed_size, vol)
        except StorageCredentialsError as e:
            return SyncOutcome(vol, False, reason=str(e))
        except Exception as e:
            why = tls_refusal(e) or f"{type(e).__name__}: {str(e)[:200]}"
            return SyncOutcome(
                vol,
                False,
                reason=f"cannot list {vol.spec.bucket}/{vol.spec.prefix} to check your disk "
                f"quota ({why})",
            )
        owner, quota = await asyncio.to_thread(disk.owner_and_quota)
        try:
            await asyncio.to_thread(
                disk.ledger.book, owner, self.workload, vol.docker_volume, vol.node, size, quota
            )
        except DiskQuotaExceeded as e:
            why = pull_refusal(vol.label, size, e.quota, e.check.held)
            return SyncOutcome(vol, False, reason=why, refused=True)
        return size

    async def run(
        self,
        operation: str,
        vol: VolumeSync,
        on_progress: Progress | None = None,
        *,
        live: bool = False,
        settle_s: float | None = None,
        max_bytes: int | None = None,
    ) -> SyncOutcome:
        """Run one ``gpulab-sync`` operation (pull, push, purge) for one volume. With a
        :class:`DiskAccount`, a pull is first booked against the owner's disk quota (and
        refused, fetching nothing, when it does not fit); without one, ``max_bytes`` caps
        what a pull may bring (the dataset cache's listed size). ``live``: a push while the workload
        runs (:mod:`gpulab.datasync.live`); any other push is a final one, which waits for a
        live push still running on the volume."""
        if operation != "pull" or self.disk is None:
            outcome = await self._run(
                operation, vol, on_progress, max_bytes, live=live, settle_s=settle_s
            )
            observe_sync(operation, outcome.ok, outcome.report)
            return outcome
        for attempt in range(2):
            booked = await self.book_pull(vol)
            if isinstance(booked, SyncOutcome):
                observe_sync(operation, False, {})
                return booked
            outcome = await self._run(operation, vol, on_progress, booked)
            observe_sync(operation, outcome.ok, outcome.report)
            # the prefix grew between the listing and the helper's own (a dataset being
            # written): the helper fetched nothing; list and book once more
            if outcome.ok or not _over_booking(outcome.report) or attempt:
                return outcome
            log.info("%s: %s grew since it was listed; booking it again", self.workload, vol.label)
        return outcome

    async def _run(
        self,
        operation: str,
        vol: VolumeSync,
        on_progress: Progress | None,
        max_bytes: int | None = None,
        live: bool = False,
        settle_s: float | None = None,
    ) -> SyncOutcome:
        store = self.stores[vol.spec.store]

        def prepare() -> tuple[tuple[dict[str, bytes], list[str]], str | None]:
            # may read the admin's credentials file and CA bundle
            return helper_store_files(store), prepare_store_dirs(store, vol.spec)

        try:
            (files, store_args), store_root = await asyncio.to_thread(prepare)
        except (StorageCredentialsError, StoreLayoutError, OSError) as e:
            return SyncOutcome(vol, False, reason=str(e))
        helper = sync_helper_spec(
            image=self.image,
            operation=operation,
            bucket=vol.spec.bucket,
            prefix=vol.spec.prefix,
            mode=vol.spec.mode,
            docker_volume=vol.docker_volume if operation != "purge" else None,
            store_kind=store.kind,
            store_root=store_root,
            endpoint_url=store.endpoint_url,
            region=store.region,
            labels={
                L_INSTANCE: self.instance,
                L_KIND: "sync-helper",
                L_WORKLOAD: self.workload,
            },
            environment={},
            files=files,
            store_args=store_args,
            # on a cluster a node's copy may be older than the store: pull deletions too
            mirror=bool(vol.node) and vol.spec.mode == "rwd",
            max_bytes=max_bytes,
            exclude=vol.exclude,
            cap=vol.cap,
            links=vol.links,
            live=live,
            settle_s=settle_s,
            # a live push never waits: one at a time; a final push, a pull (a restart right
            # after a stop) and a purge wait for a live push that holds the volume
            wait_lock_s=0.0 if live or operation == "purge" else FINAL_PUSH_WAITS_S,
        )
        final: dict = {}
        errors: list[str] = []

        def on_line(line: str) -> None:
            try:
                event = json.loads(line)
            except ValueError:
                if line.strip():
                    errors.append(line.strip())
                return
            if not isinstance(event, dict):
                return
            if event.get("event") == "report":
                final.update(event)
            elif event.get("event") == "progress" and on_progress:
                on_progress(event)

        try:
            result = await self.runtime.run_helper(helper, on_line, vol.node)
        except EngineError as e:  # the engine refused or lost the helper
            return SyncOutcome(vol, False, reason=f"sync helper failed: {e}")
        if result.exit_code == 0 and final.get("ok", False):
            if operation == "purge" and store_root:
                await asyncio.to_thread(_remove_empty_dirs, store_root, vol.spec)
            return SyncOutcome(vol, True, final)
        reason = _failure_reason(final, errors, result.exit_code)
        return SyncOutcome(vol, False, final, reason)


def _over_booking(report: dict) -> bool:
    """The helper refused the pull from its listing: more there than was booked for it."""
    failures = report.get("failures") or []
    return (
        len(failures) == 1
        and not failures[0].get("key")
        and "(--max-bytes)" in str(failures[0].get("reason", ""))
        and not report.get("completed")
    )


def _remove_empty_dirs(store_root: str, spec: VolumeSpec) -> None:
    """After a purge, the prefix's own (now empty) directories go too (rmdir never follows a
    link; one that is not empty, or already gone, stays as it is)."""
    if not spec.prefix.strip("/"):
        return  # never a bucket's own directory (purge refuses an empty prefix anyway)
    for rel in filesystem_store_dirs(spec.bucket, spec.prefix):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(store_root, rel))


def _failure_reason(report: dict, errors: list[str], code: int) -> str:
    failures = report.get("failures") or []
    if failures:
        first = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        key = first.get("key") or "(listing)"
        return f"{key}: {first.get('reason', 'failed')}{more}"
    if errors:
        return errors[-1][:300]
    return f"gpulab-sync exited with code {code}"


#: how a notebook's home is named in its progress, its record and its push verdicts
HOME_LABEL = "home"


@dataclass(frozen=True)
class HomeSync:
    """A notebook's home, kept across its stops (the site's ``home_*`` settings): where the
    image's user has it, what its sync leaves out, the most it may push."""

    dir: str
    exclude: tuple[str, ...] = ()
    cap: int | None = None


def notebook_volumes(
    storage,
    container: str,
    user: str,
    server: str,
    workspace_dir: str,
    specs: list[str],
    node: str = "",
    home: HomeSync | None = None,
) -> list[VolumeSync]:
    """The workspace and the home (when a workspace store is configured; the home where
    ``home`` says it is kept) and the user's volumes, on ``node`` (where the notebook runs;
    "" on one host)."""
    from ..volumes import parse_volume

    out = []
    ws = storage.workspace_spec(user, server, workspace_dir)
    if ws is not None:
        out.append(VolumeSync(ws, volume_name(container, ws, workspace=True), "workspace", node))
    hs = storage.home_spec(user, server, home.dir) if home is not None else None
    if hs is not None:
        vol = home_volume_name(container)
        out.append(VolumeSync(hs, vol, HOME_LABEL, node, tuple(home.exclude), home.cap, links=True))
    for raw in specs:
        spec = parse_volume(raw, storage.stores, workspace=workspace_dir)
        out.append(VolumeSync(spec, volume_name(container, spec), str(spec), node))
    return out


async def push_all(
    data: WorkloadData,
    volumes: list[VolumeSync],
    live: bool = False,
    settle_s: float | None = None,
) -> list[SyncOutcome]:
    """Push every volume that pushes (rw, rwd); ro volumes are never pushed. ``live``: the
    workload runs (a periodic or on-demand push: :mod:`gpulab.datasync.live`), taking files
    unchanged for ``settle_s`` seconds."""
    return [
        await data.run("push", v, live=live, settle_s=settle_s) for v in volumes if v.spec.pushes
    ]


def push_verdict(outcomes: list[SyncOutcome]) -> tuple[bool, str]:
    """(ok, what the record keeps). A home over its cap is not a failure (nothing was lost:
    its local copy is kept; a failure would hold the notebook SYNC_FAILED until the home
    shrank, which it cannot while stopped): it is said, and the rest pushed as usual."""
    failed = [o for o in outcomes if not o.ok and not o.over_cap]
    notes = "".join(f"; {o.summary()}" for o in outcomes if o.over_cap)
    if failed:
        names = ", ".join(o.volume.label for o in failed)
        return False, (
            f"push of {names} failed: {'; '.join(o.summary() for o in failed)}. "
            f"Nothing local was deleted; the next stop or a retry pushes again{notes}"
        )
    pushed = [o for o in outcomes if o.ok]
    if not pushed:
        return True, "compute released" + notes
    return True, "compute released; pushed " + "; ".join(o.summary() for o in pushed) + notes
