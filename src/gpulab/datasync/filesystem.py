"""The embedded object store: objects as files under ``<root>/<bucket>/<key>``.

Writes are atomic (temp file + rename). Each object has a sidecar
``<root>/.gpulab-meta/<bucket>/<key>.json`` holding its size and SHA-256, against which
downloads are verified, its permission bits (``mode``, when pushed with them) and, for a
symbolic link, ``"type": "symlink"`` (the object itself is then a regular file holding the
link's target: the store never holds a link). The ETag is a change token built from the
object file's size and mtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from .backend import DeleteOutcome
from .hashing import FileDigest, hash_bytes, hash_file, open_target
from .localtree import RESERVED_PREFIX
from .models import IntegrityError, RemoteObject, Transferred, UnsafeKey

META_DIR = ".gpulab-meta"
_BUF = 1024 * 1024


def _safe_key(key: str) -> str:
    parts = key.split("/")
    if any(p in ("", ".", "..") or p.startswith(RESERVED_PREFIX) for p in parts):
        raise UnsafeKey(f"key {key!r} is not valid for a filesystem store")
    return key


def _etag(st: os.stat_result) -> str:
    return f"{st.st_size:x}-{st.st_mtime_ns:x}"


def meta_fields(meta: object) -> tuple[int | None, bool]:
    """``(mode, link)`` an object's metadata says, whatever it holds: a mode that is no
    permission bits, or a type that is not ``symlink``, is none."""
    if not isinstance(meta, dict):
        return None, False
    mode = meta.get("mode")
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        mode = None
    return mode, meta.get("type") == "symlink"


def _copy(src: Path, dest: Path, fd: int | None = None) -> tuple[int, str]:
    """Copy src to dest (or through ``fd``, see :func:`.hashing.open_target`), fsynced;
    return (size, sha256 hex) of what was written."""
    sha = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open_target(dest, fd) as fout:
        while chunk := fin.read(_BUF):
            fout.write(chunk)
            sha.update(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return size, sha.hexdigest()


class FilesystemRemote:
    """A bucket in a directory tree that persists objects on disk."""

    def __init__(self, root: str | Path, bucket: str) -> None:
        self.root = Path(root)
        self.bucket = bucket
        self.data = self.root / bucket
        self.meta = self.root / META_DIR / bucket

    @property
    def identity(self) -> str:
        return f"file://{self.root.resolve()}/{self.bucket}"

    def ensure_bucket(self) -> bool:
        created = not self.data.is_dir()
        self.data.mkdir(parents=True, exist_ok=True)
        self.meta.mkdir(parents=True, exist_ok=True)
        return created

    def list(self, prefix: str, *, markers: bool = False) -> Iterator[RemoteObject]:
        if not self.data.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(self.data):
            dirnames[:] = [d for d in dirnames if not d.startswith(RESERVED_PREFIX)]
            rel_dir = os.path.relpath(dirpath, self.data)
            for name in filenames:
                if name.startswith(RESERVED_PREFIX):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                if key.startswith(prefix):
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:  # deleted since the directory was read
                        continue
                    yield RemoteObject(key, st.st_size, _etag(st))

    def _meta_path(self, key: str) -> Path:
        return self.meta / f"{key}.json"

    def download(self, obj: RemoteObject, dest: Path, fd: int | None = None) -> Transferred:
        path = self.data / _safe_key(obj.key)
        try:
            meta = json.loads(self._meta_path(obj.key).read_text())
        except FileNotFoundError:
            meta = None
        st = os.stat(path)
        size, sha = _copy(path, dest, fd)
        if size != st.st_size:
            raise IntegrityError(f"size mismatch: read {size} bytes, object has {st.st_size}")
        if meta is not None and (meta["size"] != size or meta["sha256"] != sha):
            raise IntegrityError("checksum mismatch: content differs from its recorded SHA-256")
        mode, link = meta_fields(meta)
        return Transferred(obj.key, size, _etag(st), sha, mode, link)

    def upload(
        self, key: str, src: Path, digest: FileDigest, mode: int | None = None
    ) -> Transferred:
        meta: dict[str, object] = {} if mode is None else {"mode": mode}
        return self._store(key, digest, meta, lambda tmp: _copy(src, tmp))

    def upload_link(self, key: str, target: bytes) -> Transferred:
        def write(tmp: Path) -> tuple[int, str]:
            tmp.write_bytes(target)
            return len(target), hash_bytes(target).sha256

        return self._store(key, hash_bytes(target), {"type": "symlink"}, write)

    def _store(self, key: str, digest: FileDigest, extra: dict, write) -> Transferred:
        """Write an object through ``write(tmp) -> (size, sha256)``, its metadata with
        ``extra``, both renamed into place once the content matches ``digest``."""
        dest = self.data / _safe_key(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{RESERVED_PREFIX}-tmp-{os.urandom(6).hex()}"
        try:
            size, sha = write(tmp)
            if (size, sha) != (digest.size, digest.sha256):
                raise IntegrityError("local file changed while it was being uploaded")
            meta_path = self._meta_path(key)
            meta_path.parent.mkdir(parents=True, exist_ok=True)
            meta_tmp = meta_path.parent / f"{RESERVED_PREFIX}-tmp-{os.urandom(6).hex()}"
            meta_tmp.write_text(json.dumps({"size": size, "sha256": sha, **extra}))
            os.replace(meta_tmp, meta_path)
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        mode, link = meta_fields(extra)
        return Transferred(key, size, _etag(os.stat(dest)), sha, mode, link)

    def delete(self, key: str, expected_etag: str) -> DeleteOutcome:
        path = self.data / _safe_key(key)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "missing"
        if _etag(st) != expected_etag:
            return "changed"
        path.unlink()
        with contextlib.suppress(FileNotFoundError):
            self._meta_path(key).unlink()
        return "deleted"

    def delete_many(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        failed: list[tuple[str, str]] = []
        for key in keys:
            try:
                path = self.data / _safe_key(key)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                with contextlib.suppress(FileNotFoundError):
                    self._meta_path(key).unlink()
                self._prune_dirs(path.parent, self.data)
                self._prune_dirs(self._meta_path(key).parent, self.meta)
            except (OSError, UnsafeKey) as exc:
                failed.append((key, str(exc)))
        return failed

    @staticmethod
    def _prune_dirs(directory: Path, top: Path) -> None:
        """Remove ``directory`` and its parents below ``top`` while they are empty."""
        while directory != top and top in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty (or already gone)
                return
            directory = directory.parent

    def digest(self, path: Path, size: int) -> FileDigest:
        return hash_file(path)

    def part_size_for(self, size: int) -> int | None:
        return None
