"""The sync manifest: what was verified in sync, kept with the local data.

A JSON file ``.gpulab-sync-manifest.json`` at the root of the local directory. Per key it
records the remote size and ETag, the content SHA-256, the local mtime (ns) after the
transfer, the permission bits the object carries and whether it is a symbolic link (whose
content is its target). Entries written before modes and links were kept have four fields:
they read as files of :data:`~.localtree.DEFAULT_MODE`. Only verified transfers are ever
recorded. The manifest is tied to one remote (identity + prefix); if either differs, it
starts empty.

The manifest, its temporary file and the lock ``.gpulab-sync.lock`` are opened relative to the
local root's directory descriptor with ``O_NOFOLLOW``: the workload owns that directory and
may have planted a link (or a directory, a FIFO) at these names. Such a thing is removed, never
followed; a manifest that cannot be read just starts empty, with a note saying why.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .localtree import DEFAULT_MODE, RESERVED_PREFIX, LocalRoot

MANIFEST_NAME = f"{RESERVED_PREFIX}-manifest.json"
LOCK_NAME = f"{RESERVED_PREFIX}.lock"
VERSION = 1


@dataclass(frozen=True)
class Entry:
    size: int
    etag: str
    sha256: str
    mtime_ns: int
    #: the permission bits the object carries (0 for a link)
    mode: int = DEFAULT_MODE
    #: a symbolic link (``sha256`` and ``size`` are its target's)
    link: bool = False


class Manifest:
    """In-memory manifest; :meth:`save` writes it atomically (temp file + rename)."""

    def __init__(self, root: LocalRoot, remote: str, prefix: str) -> None:
        self.root = root
        self.remote = remote
        self.prefix = prefix
        self.entries: dict[str, Entry] = {}
        self.dirty = False
        self.reset_reason: str | None = None

    @classmethod
    def load(cls, root: LocalRoot, remote: str, prefix: str) -> Manifest:
        m = cls(root, remote, prefix)
        try:
            data = json.loads(_read_regular(root, MANIFEST_NAME))
        except FileNotFoundError:
            return m
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
                why = "a symbolic link, removed without reading through it"
            else:
                why = f"unreadable: {exc}"
            m.reset_reason = f"manifest {why}; starting from an empty one"
            with contextlib.suppress(OSError):
                root.clear_reserved(MANIFEST_NAME)  # a link or a directory: save() replaces it
            return m
        if not isinstance(data, dict):
            m.reset_reason = "manifest unreadable: not a JSON object; starting from an empty one"
            return m
        if data.get("version") != VERSION or data.get("remote") != remote:
            m.reset_reason = "manifest belongs to another remote; starting from an empty one"
            return m
        if data.get("prefix") != prefix:
            m.reset_reason = "manifest belongs to another prefix; starting from an empty one"
            return m
        try:
            m.entries = {
                k: Entry(
                    int(v[0]),
                    str(v[1]),
                    str(v[2]),
                    int(v[3]),
                    int(v[4]) if len(v) > 4 else DEFAULT_MODE,
                    len(v) > 5 and v[5] == 1,
                )
                for k, v in data.get("objects", {}).items()
            }
        except (AttributeError, TypeError, ValueError, IndexError, KeyError):
            m.entries = {}
            m.reset_reason = "manifest unreadable (malformed entries); starting from an empty one"
        return m

    def get(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def set(self, key: str, entry: Entry) -> None:
        if self.entries.get(key) != entry:
            self.entries[key] = entry
            self.dirty = True

    def drop(self, key: str) -> None:
        if self.entries.pop(key, None) is not None:
            self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        data = {
            "version": VERSION,
            "remote": self.remote,
            "prefix": self.prefix,
            "objects": {
                k: [e.size, e.etag, e.sha256, e.mtime_ns, e.mode, *([1] if e.link else [])]
                for k, e in sorted(self.entries.items())
            },
        }
        # json.dumps, not json.dump: only the one-shot form uses the C encoder (3-4x faster,
        # and the main thread holds the GIL for less while the workers wait)
        text = json.dumps(data, separators=(",", ":")).encode()
        dirfd = self.root.fd
        # a fresh name opened O_EXCL|O_NOFOLLOW: whatever was planted under a temp name
        # (a link to someone else's file) is never opened; rename replaces a link at the
        # manifest's name instead of writing through it
        tmp = f"{MANIFEST_NAME}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o666, dir_fd=dirfd)
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(text)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, MANIFEST_NAME, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dirfd)
            raise
        self.dirty = False


def _read_regular(root: LocalRoot, name: str) -> bytes:
    """The content of regular file ``name`` in the root, never read through a link."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root.fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


class Locked(Exception):
    """Another sync is running on the same local directory."""


def _open_lock(root: LocalRoot) -> int:
    """The lock file's descriptor: a regular file at :data:`LOCK_NAME`, opened without
    following a link; anything else found there (a link, a directory, a FIFO) is removed."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(LOCK_NAME, flags, 0o666, dir_fd=root.fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EISDIR):
                raise
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        root.clear_reserved(LOCK_NAME)
    raise Locked(f"cannot take the lock {LOCK_NAME} in {root.path}: something keeps replacing it")


@contextlib.contextmanager
def locked(root: LocalRoot, wait_s: float = 0.0) -> Iterator[None]:
    """Hold an exclusive lock on ``root`` for the duration of a sync; ``wait_s``: how long to
    wait for another sync's lock first (the final push waits for a live push to end)."""
    fd = _open_lock(root)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Locked(f"another gpulab-sync is running on {root.path}") from None
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
