"""The local side of a sync: key <-> path mapping, tree scan, file placement without links.

The local directory belongs to an untrusted workload: anything in it may be a symbolic link
planted to send the sync's writes (or reads) somewhere else, such as an object store mounted
in the same helper container. So nothing here opens a local path by name from the root:
:class:`LocalRoot` holds one directory descriptor of the local root and walks relative paths
one component at a time with ``O_NOFOLLOW`` (``openat``, ``mkdirat``, ``fstatat``,
``renameat``, ``unlinkat``). A link, or a file where a directory is needed, is reported as
:class:`InTheWay`; it is never followed, whatever it points to. The backends, which take
paths, are handed ``/proc/self/fd/...`` paths of descriptors opened this way
(:func:`fd_path`): the kernel resolves them to the very file or directory opened, without
reading the workload's names again.

Where the kernel has ``openat2`` (Linux 5.6+) and the container's seccomp profile allows it,
a whole relative path is opened in one call that refuses any link on the way
(``RESOLVE_NO_SYMLINKS``): a push or a pull then costs one ``open`` per file, not one per
directory level. Elsewhere, and to say which component was in the way, the same is done one
component at a time.

Linux only (``/proc/self/fd``, and ``O_DIRECTORY``/``O_NOFOLLOW`` with ``dir_fd``), like the
sync helper container that runs it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .exclude import Excludes
from .models import Conflict, SyncError, UnsafeKey

#: Names starting with this are the engine's own files (manifest, lock, temp files).
RESERVED_PREFIX = ".gpulab-sync"

#: The longest symbolic link target the sync keeps, in bytes (Linux's PATH_MAX, NUL included).
MAX_LINK_TARGET = 4096

#: The permission bits of a file whose object carries none (written before modes were kept,
#: or by another tool), and of a manifest entry of that time: what a pull has always made.
DEFAULT_MODE = 0o644

#: Directories nested deeper than this are not pushed (each level holds one descriptor while
#: a push scans; a tree this deep is not a workspace but an attempt to exhaust them).
MAX_DEPTH = 128

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted under a file's name must not block the open
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# what openat answers for a link (ELOOP; ENOTDIR with O_DIRECTORY) or a non-directory
_NOT_FOLLOWED = (errno.ELOOP, errno.ENOTDIR)


_SYS_OPENAT2 = 437  # one number on every architecture (the unified syscall table)
_RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x04, 0x08
# where openat2 itself is missing (old kernel), refused (seccomp: EPERM) or unknown
_NO_OPENAT2 = (errno.ENOSYS, errno.EPERM, errno.E2BIG, errno.EINVAL)


class _Openat2:
    """``openat2(dirfd, path, {flags, 0, RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH})`` through
    ctypes, loaded on first use; :meth:`__call__` answers None where it is unavailable."""

    def __init__(self) -> None:
        self.available: bool | None = None  # None: not tried yet
        self._lock = threading.Lock()
        self._call = None

    def _load(self) -> None:
        with self._lock:
            if self._call is not None or self.available is False:
                return
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                syscall = libc.syscall
            except (ImportError, OSError, AttributeError):
                self.available = False
                return

            class OpenHow(ctypes.Structure):
                _fields_ = [  # noqa: RUF012 (ctypes wants a list)
                    ("flags", ctypes.c_uint64),
                    ("mode", ctypes.c_uint64),
                    ("resolve", ctypes.c_uint64),
                ]

            size = ctypes.c_size_t(ctypes.sizeof(OpenHow))
            number = ctypes.c_long(_SYS_OPENAT2)
            resolve = _RESOLVE_NO_SYMLINKS | _RESOLVE_BENEATH

            def call(dirfd: int, path: str, flags: int) -> tuple[int, int]:
                how = OpenHow(flags, 0, resolve)
                fd = syscall(
                    number, ctypes.c_int(dirfd), os.fsencode(path), ctypes.byref(how), size
                )
                return fd, ctypes.get_errno() if fd < 0 else 0

            self._call = call

    def __call__(self, dirfd: int, path: str, flags: int) -> int | None:
        """A descriptor of ``path`` below ``dirfd`` reached without any link; None if
        openat2 cannot be used (then walk); OSError as ``open`` raises it otherwise
        (ELOOP for a link on the way, ENOTDIR for a file where a directory is needed)."""
        if self.available is False:
            return None
        if self._call is None:
            self._load()
            if self._call is None:
                return None
        fd, err = self._call(dirfd, path, flags)
        if fd >= 0:
            self.available = True
            return fd
        if err in _NO_OPENAT2:
            if not self.available:  # never worked here: the kernel or seccomp lacks it
                self.available = False
            return None
        raise OSError(err, os.strerror(err), path)


openat2 = _Openat2()


class InTheWay(Conflict):
    """A link, or something other than what the sync needs, sits at a local path."""


class UnsafeLink(SyncError):
    """A symbolic link the sync does not keep: its target is empty, holds a NUL byte or is
    longer than :data:`MAX_LINK_TARGET`."""


def stored_mode(st_mode: int) -> int:
    """The permission bits a push keeps of a file: ``rwxrwxrwx`` only (never setuid, setgid
    or sticky)."""
    return st_mode & 0o777


def restored_mode(mode: int) -> int:
    """The permission bits a pull gives a file whose object carries ``mode``: its
    ``rwxrwxrwx`` (never setuid, setgid or sticky, whatever the object says), always
    readable by its owner (the next push must read it)."""
    return (mode & 0o777) | 0o400


def check_link_target(target: bytes, what: str) -> bytes:
    """``target`` if the sync keeps a link to it (text only: it is never resolved here);
    UnsafeLink otherwise."""
    if not target:
        raise UnsafeLink(f"{what}: a symbolic link with an empty target")
    if b"\x00" in target:
        raise UnsafeLink(f"{what}: a symbolic link target with a NUL byte")
    if len(target) > MAX_LINK_TARGET:
        raise UnsafeLink(
            f"{what}: a symbolic link target of {len(target)} bytes, more than {MAX_LINK_TARGET}"
        )
    return target


def normalize_prefix(prefix: str) -> str:
    """``"/a/b/"`` -> ``"a/b/"``; ``""`` stays ``""``. Keys are ``<prefix><relative path>``."""
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"invalid prefix {prefix!r}: empty, '.' or '..' segment")
    return f"{prefix}/" if prefix else ""


def key_to_relpath(key: str, prefix: str) -> str:
    """Relative local path of ``key`` (under normalised ``prefix``); raises UnsafeKey."""
    if not key.startswith(prefix):
        raise UnsafeKey(f"key {key!r} is outside prefix {prefix!r}")
    rel = key[len(prefix) :]
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise UnsafeKey(f"key {key!r} cannot be a local path (empty, '.' or '..' segment)")
    if any(p.startswith(RESERVED_PREFIX) for p in parts):
        raise UnsafeKey(f"key {key!r} uses the reserved name {RESERVED_PREFIX}*")
    return rel


def fd_path(fd: int, name: str | None = None) -> Path:
    """A path that opens what descriptor ``fd`` designates (or ``name`` in that directory)
    without resolving any name of the local tree but ``name`` itself."""
    path = Path(f"/proc/self/fd/{fd}")
    return path / name if name else path


def temp_name() -> str:
    """A unique temporary file name, reserved so that scans and listings never see it."""
    return f"{RESERVED_PREFIX}-tmp-{os.getpid()}-{os.urandom(6).hex()}"


@dataclass(frozen=True)
class LocalFile:
    """A regular file (or, where links are kept, a symbolic link: ``target`` set, ``size``
    its length) found by :meth:`LocalRoot.scan`; ``rel`` is relative to the root; ``mode``
    the permission bits a push keeps (:func:`stored_mode`; 0 for a link)."""

    key: str
    rel: str
    size: int
    mtime_ns: int
    ino: int = 0
    mode: int = DEFAULT_MODE
    target: bytes | None = None

    @property
    def link(self) -> bool:
        return self.target is not None


class LocalRoot:
    """The local directory of one sync, reached through one directory descriptor.

    The root itself is opened as given (following links: it is the caller's choice, e.g. a
    volume's mount point); nothing below it is ever reached through a link.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> LocalRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _step(self, parent: int, name: str, create: bool, rel: str) -> int:
        """Open directory ``name`` in ``parent`` without following a link (made if missing
        and ``create``); InTheWay if a link or a non-directory is there."""
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno in _NOT_FOLLOWED:
                raise InTheWay(f"{rel}: something other than a directory is in the way") from None
            raise
        with contextlib.suppress(FileExistsError):  # another worker made it meanwhile
            os.mkdir(name, 0o777, dir_fd=parent)
        return self._step(parent, name, False, rel)

    @contextlib.contextmanager
    def parent_of(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """``(directory descriptor, name)`` of relative path ``rel``: each directory on the way
        opened without following links, made if missing and ``create``. The descriptor is
        valid inside the ``with`` block only. FileNotFoundError if a directory is missing
        (and not ``create``); InTheWay if a link or a non-directory is in the way."""
        *dirs, name = rel.split("/")
        fd = self.fd
        if dirs:  # the fast way first: the whole directory path in one call
            fast = None
            with contextlib.suppress(OSError):  # missing or in the way: walk, to say which
                fast = openat2(self.fd, "/".join(dirs), _DIR_FLAGS)
            if fast is not None:
                try:
                    yield fast, name
                finally:
                    os.close(fast)
                return
        try:
            for i, part in enumerate(dirs):
                child = self._step(fd, part, create, "/".join(dirs[: i + 1]))
                if fd != self.fd:
                    os.close(fd)
                fd = child
            yield fd, name
        finally:
            if fd != self.fd:
                os.close(fd)

    def open_file(self, rel: str) -> int:
        """A read-only descriptor of the regular file at ``rel`` (the caller closes it);
        InTheWay if a link or anything but a regular file is there or on the way."""
        fd = None
        with contextlib.suppress(OSError):  # missing or in the way: walk, to say which
            fd = openat2(self.fd, rel, _FILE_FLAGS)
        if fd is not None:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        with self.parent_of(rel) as (dirfd, name):
            fd = open_regular(dirfd, name, rel)
        return fd

    def clear_reserved(self, name: str) -> bool:
        """Remove whatever is at reserved ``name`` in the root unless it is a regular file
        (a link is removed, not followed; a directory with its content). True if removed."""
        st = lstat_at(self.fd, name)
        if st is None or stat.S_ISREG(st.st_mode):
            return False
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=self.fd)  # fd-based: never follows links inside
        else:
            os.unlink(name, dir_fd=self.fd)
        return True

    def scan(
        self,
        prefix: str,
        problems: list[tuple[str, str]],
        exclude: Excludes | None = None,
        links: bool = False,
    ) -> Iterator[LocalFile]:
        """Yield the regular files under the root, and its symbolic links if ``links`` (each
        with its target, read with ``readlinkat``: never followed; a link to a directory is
        a link, its directory is not read). Otherwise links (to files or directories), the
        engine's files and what ``exclude`` covers are skipped (an excluded directory is not
        read); directories that cannot be read (or are deeper than :data:`MAX_DEPTH`) and
        links the sync does not keep (:func:`check_link_target`) are appended to
        ``problems`` as ``(key, reason)``. One descriptor per level of the directory being
        read is held, never one per directory of the tree."""
        yield from self._scan(self.fd, "", prefix, problems, 0, exclude or None, links)

    def _scan(
        self,
        fd: int,
        rel: str,
        prefix: str,
        problems: list[tuple[str, str]],
        depth: int,
        exclude: Excludes | None,
        links: bool = False,
    ) -> Iterator[LocalFile]:
        with os.scandir(fd) as it:  # entries' stat() use fstatat(fd, name): fd stays open
            entries = list(it)
        subdirs: list[str] = []
        for entry in entries:
            if entry.name.startswith(RESERVED_PREFIX):
                continue
            if entry.is_dir(follow_symlinks=False):
                if exclude is None or not exclude.matches(rel + entry.name, is_dir=True):
                    subdirs.append(entry.name)
            elif entry.is_file(follow_symlinks=False):
                if exclude is not None and exclude.matches(rel + entry.name, is_dir=False):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted since the directory was read
                    continue
                yield LocalFile(
                    prefix + rel + entry.name,
                    rel + entry.name,
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ino,
                    stored_mode(st.st_mode),
                )
            elif links and entry.is_symlink():
                if exclude is not None and exclude.matches(rel + entry.name, is_dir=False):
                    continue
                key = prefix + rel + entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                    target = check_link_target(read_link(fd, entry.name, rel + entry.name), key)
                except (FileNotFoundError, InTheWay):  # deleted or replaced since listed
                    continue
                except UnsafeLink as exc:
                    problems.append((key, str(exc)))
                    continue
                yield LocalFile(
                    key, rel + entry.name, len(target), st.st_mtime_ns, st.st_ino, 0, target
                )
        for name in subdirs:
            sub = f"{rel}{name}/"
            if depth + 1 >= MAX_DEPTH:
                problems.append((prefix + sub, f"nested deeper than {MAX_DEPTH} directories"))
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:  # unreadable, or replaced by a link since it was listed
                problems.append((prefix + sub, f"directory not read: {exc.strerror}"))
                continue
            try:
                yield from self._scan(child, sub, prefix, problems, depth + 1, exclude, links)
            finally:
                os.close(child)


def lstat_at(dirfd: int, name: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in ``dirfd`` (a link is described, not followed); None if absent."""
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_link(dirfd: int, name: str, rel: str) -> bytes:
    """The target of symbolic link ``name`` in ``dirfd`` (``readlinkat``: the link is read,
    never followed); InTheWay if something else is there."""
    try:
        return os.readlink(os.fsencode(name), dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a link
            raise InTheWay(f"{rel}: something other than a symbolic link is in the way") from None
        raise


def place_link(dirfd: int, name: str, target: bytes, rel: str) -> None:
    """Make ``name`` in ``dirfd`` a symbolic link to ``target``: made at a fresh temporary
    name (``symlinkat``), then renamed over ``name``, which replaces a file or a link there
    (the link itself: nothing is written through it, and the target is never resolved);
    InTheWay if a directory is there."""
    tmp = temp_name()
    os.symlink(check_link_target(target, rel), tmp, dir_fd=dirfd)
    try:
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dirfd)
        if isinstance(exc, OSError) and exc.errno in (errno.EISDIR, errno.ENOTEMPTY):
            raise InTheWay(f"{rel}: a directory is in the way") from None
        raise


def open_regular(dirfd: int, name: str, rel: str) -> int:
    """A read-only descriptor of regular file ``name`` in ``dirfd``, never through a link."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno in _NOT_FOLLOWED:
            raise InTheWay(f"{rel}: something other than a file is in the way") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InTheWay(f"{rel}: something other than a file is in the way")
    return fd


def create_temp(dirfd: int) -> tuple[str, int]:
    """Create an empty temporary file in ``dirfd`` (``O_EXCL|O_NOFOLLOW``: a name that already
    exists, a link included, is never opened); return its name and a writable descriptor
    (the caller closes it). Same directory as the file it will replace, so that the final
    rename is atomic."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    name = temp_name()
    return name, os.open(name, flags, 0o666, dir_fd=dirfd)
