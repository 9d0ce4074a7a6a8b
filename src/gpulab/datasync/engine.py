"""The sync engine: incremental, parallel, verified pull and push.

Both directions work from the manifest kept with the local data (see :mod:`.manifest`):

- ``pull`` lists the remote prefix and downloads only objects whose size/ETag differ from
  the manifest, to a temporary file renamed into place once verified. Local changes made
  since the last sync are never overwritten: if the remote object changed too, the object
  is reported as a conflict and the local file is kept.
- ``push`` walks the local tree and uploads only files whose size/mtime differ from the
  manifest and whose SHA-256 then differs too. ``rw`` never deletes remote objects; ``rwd``
  also deletes objects the manifest knows were synced and whose local file is gone (and only
  if the remote object is still the one that was synced); ``ro`` pushes nothing.
- ``purge`` (in :mod:`.purging`) deletes every object under a (non-empty) prefix.
- ``push(..., live=True)``: a push while the workload runs and may be writing. It takes only
  settled files and never sends a file that changes while it is read, nor deletes anything
  (the rule: :mod:`.live`); the final push at the stop takes everything, as above.

Only verified transfers enter the manifest, so a failed run is simply resumed by the next.
If the store becomes unreachable (after the client's own retries), the remaining objects
fail at once instead of each waiting out its retries.

The local directory is the workload's, hence untrusted: every local file and directory is
reached through :class:`~.localtree.LocalRoot` without following links (a link in the way is
a per-object conflict, and push uploads neither links nor files below linked directories).
Linux only, like the sync helper container.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from .backend import Remote
from .exclude import Excludes
from .hashing import hash_bytes, hash_file
from .live import SETTLE_S, FileState, changed, state_of, unsettled
from .localtree import (
    MAX_LINK_TARGET,
    InTheWay,
    LocalFile,
    LocalRoot,
    check_link_target,
    create_temp,
    fd_path,
    key_to_relpath,
    lstat_at,
    normalize_prefix,
    open_regular,
    place_link,
    read_link,
    restored_mode,
    stored_mode,
)
from .manifest import Entry, Manifest, locked
from .models import (
    Conflict,
    Failure,
    IntegrityError,
    RemoteObject,
    RemoteUnavailable,
    SyncError,
    SyncProgress,
    SyncReport,
    Transferred,
    UnsafeKey,
    tls_refusal,
)

ProgressCallback = Callable[[SyncProgress], None]
T = TypeVar("T")
PUSH_MODES = ("ro", "rw", "rwd")


#: notes a report carries at most (one per file left alone by a live push, then none)
MAX_NOTES = 20

#: files at least this large are hashed under :attr:`SyncOptions.hashers` (smaller ones
#: hash in well under a millisecond: gating them would only add contention)
LARGE_FILE = 8 * 1024 * 1024


def _default_hashers() -> int:
    """The CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class SyncOptions:
    """Engine tuning: ``workers`` objects in flight; ``attempts`` per object for transfers
    that fail verification (transport errors are retried by the client itself).

    ``hashers``: how many large files a push hashes at once (default: one per CPU the
    process may use). A push hashes each file before sending it; left free, every worker
    would hash its large file at the same time, sharing the CPUs, so that none is sent
    before all are hashed. Gated, the first files are on the wire while the next are hashed
    (4 x 256 MiB on 2 CPUs: median 6.1 s gated at 2 against 8.4 s free, 3 rounds, moto).
    """

    workers: int = 16
    attempts: int = 3
    backoff_s: float = 0.2
    progress_interval_s: float = 0.25
    manifest_save_interval_s: float = 5.0
    hashers: int = field(default_factory=_default_hashers)


class _Run:
    """Counters, failures and throttled progress callbacks of one sync (main thread only)."""

    def __init__(
        self, report: SyncReport, progress: ProgressCallback | None, interval: float
    ) -> None:
        self.report = report
        self.progress = progress
        self.interval = interval
        self.started = time.monotonic()
        self.last_emit = 0.0

    def skip(self) -> None:
        self.report.skipped += 1
        self.report.processed += 1

    def complete(self, nbytes: int) -> None:
        self.report.completed += 1
        self.report.processed += 1
        self.report.bytes_transferred += nbytes

    def in_flux(self, key: str, why: str) -> None:
        """A live push left this file alone (written too recently, or changed while read)."""
        self.report.in_flux += 1
        self.skip()
        if len(self.report.notes) < MAX_NOTES:
            self.report.notes.append(f"{key}: {why}")

    def deleted(self) -> None:
        self.report.deleted += 1
        self.report.processed += 1

    def fail(self, key: str, exc: BaseException | str) -> None:
        self.report.failed += 1
        self.report.processed += 1
        self.report.failures.append(Failure(key, exc if isinstance(exc, str) else _reason(exc)))

    def emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is None or (not force and now - self.last_emit < self.interval):
            return
        self.last_emit = now
        r = self.report
        self.progress(
            SyncProgress(
                r.objects_total,
                r.processed,
                r.completed,
                r.skipped,
                r.failed,
                r.deleted,
                r.bytes_transferred,
            )
        )

    def finish(self) -> SyncReport:
        self.report.elapsed_s = round(time.monotonic() - self.started, 3)
        self.emit(force=True)
        return self.report


def _reason(exc: BaseException) -> str:
    tls = tls_refusal(exc)
    if tls:
        return tls
    if isinstance(exc, SyncError):
        return str(exc)
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', 'error')}: {err.get('Message', '')}".strip()
    if isinstance(exc, OSError):
        return f"local I/O error: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _with_retries(fn: Callable[[], T], opts: SyncOptions, abort: threading.Event) -> T:
    """Run ``fn``; retry integrity failures with exponential backoff; stop all on outage."""
    for attempt in range(opts.attempts):
        if abort.is_set():
            raise RemoteUnavailable("not attempted: the object store became unreachable")
        try:
            return fn()
        except RemoteUnavailable:
            abort.set()
            raise
        except IntegrityError:
            if attempt == opts.attempts - 1:
                raise
            time.sleep(opts.backoff_s * 2**attempt)
    raise AssertionError("unreachable")


def _run_tasks(
    run: _Run,
    manifest: Manifest,
    opts: SyncOptions,
    tasks: list[tuple[str, Callable[[], T]]],
    on_result: Callable[[str, T], None],
) -> None:
    """Run tasks in a thread pool; results and failures are handled in this thread."""
    abort = threading.Event()
    last_save = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, opts.workers)) as pool:
        futures: dict[Future[T], str] = {
            pool.submit(_with_retries, fn, opts, abort): key for key, fn in tasks
        }
        try:
            for fut in as_completed(futures):
                key = futures[fut]
                try:
                    result = fut.result()
                except Exception as exc:
                    run.fail(key, exc)
                else:
                    on_result(key, result)
                run.emit()
                if time.monotonic() - last_save > opts.manifest_save_interval_s:
                    manifest.save()
                    last_save = time.monotonic()
        except BaseException:
            abort.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise


# -- pull ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pulled:
    transferred: Transferred
    mtime_ns: int
    downloaded: bool
    #: the permission bits of the local file (0 for a link)
    mode: int = 0
    #: False: a link object in a volume that does not keep links: not restored, not recorded
    kept: bool = True


def _pull_one(
    remote: Remote,
    obj: RemoteObject,
    root: LocalRoot,
    rel: str,
    entry: Entry | None,
    links: bool = False,
) -> _Pulled:
    """Download ``obj`` to ``rel`` unless that would lose a local change.

    Each directory on the way is opened (made if missing) without following links; the
    object goes to a new temporary file (``O_EXCL|O_NOFOLLOW``) in that directory, written
    through its descriptor (or, for libraries that need a name, through the path
    ``/proc/self/fd/<dir>/<name>``), given the mode the object carries (:func:`restored_mode`:
    never setuid, setgid or sticky) through that descriptor, then renamed over ``rel``
    within the directory descriptor: nothing outside the local tree can be written or read.

    A link object (``links``: else it is left out, unrecorded) is downloaded the same way,
    its content checked as a target (:func:`check_link_target`), and a link to it made at a
    temporary name and renamed over ``rel``: a file or a link there is replaced, never
    written through; its target is never resolved. A link already at ``rel`` is replaced
    only if it is the one last synced (else a conflict)."""
    with root.parent_of(rel, create=True) as (dirfd, name):
        st = lstat_at(dirfd, name)
        if st is not None and links and stat.S_ISLNK(st.st_mode):
            now = hash_bytes(read_link(dirfd, name, rel)).sha256
            if entry is None or not entry.link or now != entry.sha256:
                raise Conflict("a local symbolic link not synced as it is; kept it")
        elif st is not None:
            if not stat.S_ISREG(st.st_mode):
                raise InTheWay(f"{rel}: something other than a file is in the way")
            local_changed = entry is None or (st.st_size, st.st_mtime_ns) != (
                entry.size,
                entry.mtime_ns,
            )
            if local_changed:
                fd = open_regular(dirfd, name, rel)
                try:
                    digest = hash_file(fd, md5=True)
                finally:
                    os.close(fd)
                if entry is None:
                    if digest.size == obj.size and digest.md5 == obj.etag:
                        adopted = Transferred(obj.key, obj.size, obj.etag, digest.sha256)
                        mode = stored_mode(st.st_mode)
                        return _Pulled(adopted, st.st_mtime_ns, downloaded=False, mode=mode)
                    raise Conflict(
                        "a local file not synced before differs from the remote object; kept it"
                    )
                if digest.sha256 != entry.sha256:
                    raise Conflict(
                        "changed both locally and remotely since the last sync; kept local"
                    )
        tmp, fd = create_temp(dirfd)
        placed = False
        try:
            got = remote.download(obj, fd_path(dirfd, tmp), fd)
            if got.link and not links:
                return _Pulled(got, 0, downloaded=False, kept=False)
            if got.link:
                if got.size > MAX_LINK_TARGET:  # refused before it is read back
                    check_link_target(b"x" * got.size, rel)
                reader = open_regular(dirfd, tmp, rel)
                try:
                    target = os.pread(reader, MAX_LINK_TARGET + 1, 0)
                finally:
                    os.close(reader)
                place_link(dirfd, name, target, rel)
                mode = 0
            else:
                if got.mode is not None:
                    os.fchmod(fd, restored_mode(got.mode))
                mode = stored_mode(os.fstat(fd).st_mode)
                os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
                placed = True
        finally:
            os.close(fd)
            if not placed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dirfd)
        mtime_ns = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mtime_ns
    return _Pulled(got, mtime_ns, downloaded=True, mode=mode)


def pull(
    remote: Remote,
    local_dir: str | Path,
    prefix: str = "",
    *,
    delete: bool = False,
    progress: ProgressCallback | None = None,
    options: SyncOptions | None = None,
    max_bytes: int | None = None,
    exclude: Excludes | None = None,
    links: bool = False,
    wait_lock_s: float = 0.0,
) -> SyncReport:
    """Bring ``local_dir`` up to date with ``remote``'s objects under ``prefix``.

    The bucket is created if missing. With ``delete``, local files whose remote object was
    deleted since the last sync (and that were not changed locally) are removed.

    ``max_bytes``: the most the objects under the prefix may weigh together (what the owner's
    disk quota booked for this volume); more is refused from the listing, before anything is
    downloaded, with one failure that says how much is there.

    ``exclude``: paths left alone (:mod:`.exclude`): their objects are not downloaded (nor
    counted) and, with ``delete``, their local files are never removed.

    Files get the permission bits their objects carry (:func:`.localtree.restored_mode`).
    ``links``: objects pushed as symbolic links are restored as links (never followed,
    see :func:`_pull_one`); without it they are left out, with a note.

    ``wait_lock_s``: how long to wait for another sync of ``local_dir`` to end (a live push
    that started as the workload stopped), Locked after that.
    """
    opts = options or SyncOptions()
    prefix = normalize_prefix(prefix)
    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    report = SyncReport("pull", remote.bucket, prefix, "mirror" if delete else "update")
    run = _Run(report, progress, opts.progress_interval_s)
    with LocalRoot(local) as root, locked(root, wait_lock_s):
        manifest = Manifest.load(root, remote.identity, prefix)
        if manifest.reset_reason:
            report.notes.append(manifest.reset_reason)
        try:
            try:
                if remote.ensure_bucket():
                    report.notes.append(f"bucket {remote.bucket} did not exist: created it")
                listing = {
                    obj.key: obj
                    for obj in remote.list(prefix)
                    if not _excluded(exclude, obj.key, prefix)
                }
            except Exception as exc:
                run.fail("", f"cannot list {remote.bucket}/{prefix}: {_reason(exc)}")
                return run.finish()
            total = sum(obj.size for obj in listing.values())
            if max_bytes is not None and total > max_bytes:
                run.fail(
                    "",
                    f"{remote.bucket}/{prefix} holds {_human(total)} in {len(listing)} objects, "
                    f"more than the {_human(max_bytes)} booked for this pull (--max-bytes): "
                    "nothing was pulled",
                )
                return run.finish()
            gone = [
                k
                for k in manifest.entries
                if delete and k not in listing and not _excluded(exclude, k, prefix)
            ]
            report.objects_total = len(listing) + len(gone)
            tasks: list[tuple[str, Callable[[], _Pulled]]] = []
            for key, obj in listing.items():
                entry = manifest.get(key)
                if entry is not None and (entry.etag, entry.size) == (obj.etag, obj.size):
                    run.skip()
                    continue
                try:
                    rel = key_to_relpath(key, prefix)
                except UnsafeKey as exc:
                    run.fail(key, exc)
                    continue
                tasks.append(
                    (key, lambda o=obj, r=rel, e=entry: _pull_one(remote, o, root, r, e, links))
                )
            for key in gone:
                _delete_local(run, manifest, root, prefix, key, links)
            run.emit(force=True)

            def on_result(key: str, res: _Pulled) -> None:
                t = res.transferred
                if not res.kept:
                    run.skip()
                    if len(report.notes) < MAX_NOTES:
                        report.notes.append(
                            f"{key}: a symbolic link; this volume keeps none: not restored"
                        )
                    return
                manifest.set(key, Entry(t.size, t.etag, t.sha256, res.mtime_ns, res.mode, t.link))
                if res.downloaded:
                    run.complete(t.size)
                else:
                    run.skip()

            _run_tasks(run, manifest, opts, tasks, on_result)
        finally:
            manifest.save()
    return run.finish()


def _excluded(exclude: Excludes | None, key: str, prefix: str) -> bool:
    """Whether ``key`` (under ``prefix``) is a path ``exclude`` covers; a key that cannot be
    a local path is not (it fails on its own)."""
    if not exclude:
        return False
    try:
        return exclude.excludes(key_to_relpath(key, prefix))
    except UnsafeKey:
        return False


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _delete_local(
    run: _Run, manifest: Manifest, root: LocalRoot, prefix: str, key: str, links: bool = False
) -> None:
    """Remove the local file of ``key`` (deleted remotely) if it is still the synced one,
    reached without following links; a link on the way means the file is not there. Where
    links are kept, a link synced as such is removed (the link, not what it points to) if
    its target is still the synced one."""
    entry = manifest.entries[key]
    try:
        rel = key_to_relpath(key, prefix)
        with root.parent_of(rel) as (dirfd, name):
            st = lstat_at(dirfd, name)
            synced_link = (
                st is not None
                and links
                and entry.link
                and stat.S_ISLNK(st.st_mode)
                and hash_bytes(read_link(dirfd, name, rel)).sha256 == entry.sha256
            )
            synced_file = (
                st is not None
                and not entry.link
                and stat.S_ISREG(st.st_mode)
                and (st.st_size, st.st_mtime_ns) == (entry.size, entry.mtime_ns)
            )
            if synced_link or synced_file:
                os.unlink(name, dir_fd=dirfd)
                run.deleted()
            else:
                run.skip()  # already gone, or changed locally since: keep the local version
        manifest.drop(key)
    except FileNotFoundError:  # a directory on the way is gone: so is the file
        run.skip()
        manifest.drop(key)
    except InTheWay as exc:  # replaced by a link or a file: not followed, nothing deleted
        run.skip()
        run.report.notes.append(f"{key}: not deleted locally: {exc}")
        manifest.drop(key)
    except (OSError, UnsafeKey) as exc:
        run.fail(key, exc)


# -- push ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pushed:
    transferred: Transferred
    uploaded: bool
    #: the permission bits sent (0 for a link)
    mode: int = 0


@dataclass(frozen=True)
class _InFlux:
    """A live push's file that changed while it was read (:mod:`.live`): left alone."""

    why: str


def _push_one(
    remote: Remote,
    root: LocalRoot,
    f: LocalFile,
    entry: Entry | None,
    hashers: threading.Semaphore,
    live: bool = False,
) -> _Pushed | _InFlux:
    """Hash and upload one file, opened without following links; the backend reads it
    through ``/proc/self/fd/<fd>``, i.e. the very file that was opened.

    ``live``: the file must be the one scanned, unchanged, once opened and once hashed, and
    an upload that fails verification while the file changed is in flux, not a failure."""
    if f.link:
        return _push_link(remote, root, f, entry)
    fd = root.open_file(f.rel)
    try:
        mode = stored_mode(os.fstat(fd).st_mode)
        scanned = FileState(f.ino, f.size, f.mtime_ns)
        if live and (why := changed(scanned, state_of(os.fstat(fd)), "since the scan")):
            return _InFlux(why)
        src = fd_path(fd)
        with hashers if f.size >= LARGE_FILE else contextlib.nullcontext():
            digest = remote.digest(src, f.size)
        if live and (why := changed(scanned, state_of(os.fstat(fd)), "while it was hashed")):
            return _InFlux(why)
        if (
            entry is not None
            and not entry.link
            and (digest.size, digest.sha256, mode) == (entry.size, entry.sha256, entry.mode)
        ):
            same = Transferred(f.key, entry.size, entry.etag, entry.sha256)
            return _Pushed(same, uploaded=False, mode=mode)  # only the mtime changed
        try:
            return _Pushed(remote.upload(f.key, src, digest, mode), uploaded=True, mode=mode)
        except IntegrityError:
            if live and (why := changed(scanned, state_of(os.fstat(fd)), "during the upload")):
                return _InFlux(why)
            raise
    finally:
        os.close(fd)


def _push_link(remote: Remote, root: LocalRoot, f: LocalFile, entry: Entry | None) -> _Pushed:
    """Upload one symbolic link as an object holding its target: the link is read again
    (``readlinkat`` from its directory, opened without following links), never followed."""
    with root.parent_of(f.rel) as (dirfd, name):
        target = check_link_target(read_link(dirfd, name, f.rel), f.key)
    sha = hash_bytes(target).sha256
    if entry is not None and entry.link and entry.sha256 == sha:
        return _Pushed(Transferred(f.key, entry.size, entry.etag, sha, None, True), False)
    return _Pushed(remote.upload_link(f.key, target), uploaded=True)


def _unchanged(entry: Entry | None, f: LocalFile) -> bool:
    """Whether the manifest says ``f`` is as last synced: a file by its size, mtime and
    mode, a link by its target."""
    if entry is None or entry.link != f.link:
        return False
    if f.target is not None:
        return entry.sha256 == hash_bytes(f.target).sha256
    return (entry.size, entry.mtime_ns, entry.mode) == (f.size, f.mtime_ns, f.mode)


def push(
    local_dir: str | Path,
    remote: Remote,
    prefix: str = "",
    mode: str = "rw",
    *,
    progress: ProgressCallback | None = None,
    options: SyncOptions | None = None,
    max_bytes: int | None = None,
    exclude: Excludes | None = None,
    live: bool = False,
    settle_s: float = SETTLE_S,
    now_ns: Callable[[], int] = time.time_ns,
    wait_lock_s: float = 0.0,
    links: bool = False,
) -> SyncReport:
    """Send local changes under ``local_dir`` to ``remote`` under ``prefix``.

    ``rw``: additions and changes; ``rwd``: also deletions of synced objects; ``ro``: nothing.

    ``max_bytes``: the most the files pushed may weigh together (a home's cap); more is
    refused from the scan, before anything is uploaded or deleted, with one failure that says
    how much is there. ``exclude``: paths left alone (:mod:`.exclude`): not read, not
    uploaded, and their objects never deleted.

    ``live``: the workload runs and may be writing (:mod:`.live`): files written less than
    ``settle_s`` seconds ago (by ``now_ns``) and files that change while they are read are
    left alone (counted in ``in_flux``), and nothing is deleted, even for ``rwd``.

    ``wait_lock_s``: how long to wait for another sync of ``local_dir`` to end (Locked
    after that); the final push waits so for a live push that is still running.

    Each file's permission bits go with it (:func:`.localtree.stored_mode`); a mode change
    alone sends the file again. ``links``: symbolic links are pushed as objects holding
    their target (read, never followed; a link to a directory is a link: what it points
    to is not read); without it they are skipped, as files below linked directories are.
    """
    if mode not in PUSH_MODES:
        raise ValueError(f"mode must be one of {', '.join(PUSH_MODES)}, not {mode!r}")
    opts = options or SyncOptions()
    prefix = normalize_prefix(prefix)
    local = Path(local_dir)
    if not local.is_dir():
        raise FileNotFoundError(f"local directory {local} does not exist")
    report = SyncReport("push", remote.bucket, prefix, mode, live=live)
    run = _Run(report, progress, opts.progress_interval_s)
    if mode == "ro":
        report.notes.append("read-only volume: nothing pushed")
        return run.finish()
    with LocalRoot(local) as root, locked(root, wait_lock_s):
        manifest = Manifest.load(root, remote.identity, prefix)
        if manifest.reset_reason:
            report.notes.append(manifest.reset_reason)
        try:
            unread: list[tuple[str, str]] = []
            files = list(root.scan(prefix, unread, exclude, links))
            total = sum(f.size for f in files)
            if max_bytes is not None and total > max_bytes:
                run.fail(
                    "",
                    f"{_human(total)} in {len(files)} files, more than its cap of "
                    f"{_human(max_bytes)} (--max-bytes): nothing was pushed or deleted",
                )
                return run.finish()
            present = {f.key for f in files}
            gone: list[str] = []
            if mode == "rwd" and live:
                report.notes.append("live push: deletions are mirrored at the final push")
            elif mode == "rwd":  # keys below an unreadable directory are not gone: keep them
                unreadable = tuple(key for key, _ in unread)
                gone = [
                    k
                    for k in manifest.entries
                    if k not in present
                    and not k.startswith(unreadable)
                    and not _excluded(exclude, k, prefix)
                ]
            report.objects_total = len(files) + len(gone) + len(unread)
            for key, reason in unread:
                run.fail(key, reason)
            tasks: list[tuple[str, Callable[[], Any]]] = []
            hashers = threading.Semaphore(max(1, opts.hashers))
            scanned_at = now_ns()
            for f in files:
                entry = manifest.get(f.key)
                if _unchanged(entry, f):
                    run.skip()
                elif live and (why := unsettled(f.mtime_ns, scanned_at, settle_s)):
                    run.in_flux(f.key, why)
                else:
                    tasks.append(
                        (f.key, lambda f=f, e=entry: _push_one(remote, root, f, e, hashers, live))
                    )
            for key in gone:
                etag = manifest.entries[key].etag
                tasks.append((key, lambda k=key, t=etag: remote.delete(k, t)))
            run.emit(force=True)
            if tasks:
                try:
                    remote.ensure_bucket()
                except Exception as exc:
                    reason = f"bucket {remote.bucket} unavailable: {_reason(exc)}"
                    for key, _ in tasks:
                        run.fail(key, reason)
                    return run.finish()
            mtimes = {f.key: f.mtime_ns for f in files}

            def on_result(key: str, res: Any) -> None:
                if isinstance(res, _InFlux):  # not in the manifest: the next push tries again
                    run.in_flux(key, res.why)
                elif isinstance(res, _Pushed):
                    t = res.transferred
                    manifest.set(
                        key, Entry(t.size, t.etag, t.sha256, mtimes[key], res.mode, t.link)
                    )
                    if res.uploaded:
                        run.complete(t.size)
                    else:
                        run.skip()
                else:  # a delete outcome: "deleted", "missing" or "changed"
                    manifest.drop(key)
                    if res == "deleted":
                        run.deleted()
                    else:
                        run.skip()
                        if res == "changed":
                            report.notes.append(f"{key}: changed remotely since; not deleted")

            _run_tasks(run, manifest, opts, tasks, on_result)
        finally:
            manifest.save()
    return run.finish()
