"""File digests used to detect changes and to verify transfers."""

from __future__ import annotations

import base64
import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_BUF = 4 * 1024 * 1024


@dataclass(frozen=True)
class FileDigest:
    """Digests of a file's content.

    ``md5`` is the hex MD5 of the whole file (the ETag S3 gives a single-part object);
    ``multipart_etag`` the ETag S3 gives it when uploaded in parts of ``part_size`` bytes;
    ``crc32`` its CRC-32 (to check S3's ``x-amz-checksum-crc32``). Each may be None when not
    asked for.
    """

    size: int
    sha256: str
    md5: str | None = None
    multipart_etag: str | None = None
    crc32: int | None = None

    @property
    def sha256_b64(self) -> str:
        return base64.b64encode(bytes.fromhex(self.sha256)).decode()

    @property
    def crc32_b64(self) -> str | None:
        if self.crc32 is None:
            return None
        return base64.b64encode(self.crc32.to_bytes(4, "big")).decode()


class StreamHasher:
    """Digests of a byte stream fed in order with :meth:`update` (any chunk sizes).

    Always SHA-256; MD5 of the whole stream if ``md5``; CRC-32 if ``crc32``; the multipart
    ETag for parts of ``part_size`` bytes if given. Used both to hash files and to hash data
    as it is transferred, so that a transfer needs no second pass over the file.
    """

    def __init__(
        self,
        *,
        md5: bool = False,
        part_size: int | None = None,
        crc32: bool = False,
    ) -> None:
        self.size = 0
        self._sha = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self._crc: int | None = 0 if crc32 else None
        self._part_size = part_size
        self._part = hashlib.md5(usedforsecurity=False) if part_size else None
        self._in_part = 0
        self._part_md5s: list[bytes] = []

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self.size += len(chunk)
        self._sha.update(chunk)
        if self._md5 is not None:
            self._md5.update(chunk)
        if self._crc is not None:
            self._crc = zlib.crc32(chunk, self._crc)
        if self._part is not None and self._part_size:
            view = memoryview(chunk)
            while view:
                take = min(len(view), self._part_size - self._in_part)
                self._part.update(view[:take])
                self._in_part += take
                view = view[take:]
                if self._in_part == self._part_size:
                    self._part_md5s.append(self._part.digest())
                    self._part = hashlib.md5(usedforsecurity=False)
                    self._in_part = 0

    def digest(self) -> FileDigest:
        multipart = None
        if self._part is not None:
            md5s = list(self._part_md5s)
            if self._in_part or not md5s:
                md5s.append(self._part.digest())
            joined = hashlib.md5(b"".join(md5s), usedforsecurity=False).hexdigest()
            multipart = f"{joined}-{len(md5s)}"
        return FileDigest(
            size=self.size,
            sha256=self._sha.hexdigest(),
            md5=self._md5.hexdigest() if self._md5 is not None else None,
            multipart_etag=multipart,
            crc32=self._crc,
        )


def open_target(dest: Path | int, fd: int | None = None) -> BinaryIO:
    """``dest`` opened for writing, unbuffered: through ``fd`` when given (left open: its
    owner closes it), else by name (created or emptied). A name opens the file anew, which
    for the engine's ``/proc/self/fd/...`` paths costs a lookup in /proc per file."""
    if fd is not None:
        return open(fd, "wb", buffering=0, closefd=False)
    return open(dest, "wb", buffering=0)


def hash_file(path: Path | int, *, md5: bool = False, part_size: int | None = None) -> FileDigest:
    """Read ``path`` once, computing SHA-256 and, if asked, MD5 and the multipart ETag.

    ``path`` may be an open descriptor (read from its current offset, left open)."""
    hasher = StreamHasher(md5=md5, part_size=part_size)
    buf = bytearray(_BUF)
    view = memoryview(buf)
    with open(path, "rb", buffering=0, closefd=not isinstance(path, int)) as f:
        while n := f.readinto(buf):
            hasher.update(view[:n])
    return hasher.digest()


def hash_bytes(data: bytes) -> FileDigest:
    """SHA-256 and MD5 of ``data`` (a symbolic link's target, sent as an object's body)."""
    hasher = StreamHasher(md5=True)
    hasher.update(data)
    return hasher.digest()
