"""File digests used to detect changes and to verify transfers."""

from __future__ import annotations

import base64
import hashlib
import io
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
    ``crc32`` its CRC-32 (as S3's ``x-amz-checksum-crc32``, and to tell whether the bytes sent
    are the bytes hashed). Each may be None when not asked for.
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

    SHA-256 unless ``sha256`` is false; MD5 of the whole stream if ``md5``; CRC-32 if
    ``crc32``; the multipart ETag for parts of ``part_size`` bytes if given. Used both to hash
    files and to hash data as it is transferred, so that a transfer needs no second pass
    over the file.
    """

    def __init__(
        self,
        *,
        md5: bool = False,
        part_size: int | None = None,
        crc32: bool = False,
        sha256: bool = True,
    ) -> None:
        self.size = 0
        self._sha = hashlib.sha256() if sha256 else None
        self._md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self._crc: int | None = 0 if crc32 else None
        self._part_size = part_size
        self._part = hashlib.md5(usedforsecurity=False) if part_size else None
        self._in_part = 0
        self._part_md5s: list[bytes] = []

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self.size += len(chunk)
        if self._sha is not None:
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
            sha256=self._sha.hexdigest() if self._sha is not None else "",
            md5=self._md5.hexdigest() if self._md5 is not None else None,
            multipart_etag=multipart,
            crc32=self._crc,
        )


def hash_file(
    path: Path, *, md5: bool = False, part_size: int | None = None, crc32: bool = False
) -> FileDigest:
    """Read ``path`` once, computing SHA-256 and, if asked, MD5, CRC-32, the multipart ETag."""
    hasher = StreamHasher(md5=md5, part_size=part_size, crc32=crc32)
    buf = bytearray(_BUF)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            hasher.update(view[:n])
    return hasher.digest()


class HashingReader(io.RawIOBase):
    """A file opened for an upload that hashes what is read from it, i.e. what is sent.

    It ends after ``size`` bytes and raises ``changed`` if the file ends before; rewinding to
    the start (as an HTTP client does to retry) starts the hashes again.
    """

    def __init__(self, f: BinaryIO, size: int, changed: type[Exception], **hashes: bool) -> None:
        self._f = f
        self._size = size
        self._changed = changed
        self._hashes = hashes
        self.hasher = StreamHasher(**hashes)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.hasher.size

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if (pos, whence) != (0, io.SEEK_SET):
            raise io.UnsupportedOperation("only a rewind to the start")
        self._f.seek(0)
        self.hasher = StreamHasher(**self._hashes)
        return 0

    def read(self, n: int = -1) -> bytes:
        left = self._size - self.hasher.size
        if left <= 0:
            return b""
        data = self._f.read(left if n is None or n < 0 else min(n, left))
        if not data:
            raise self._changed(f"the file ended after {self.hasher.size} of {self._size} bytes")
        self.hasher.update(data)
        return data
