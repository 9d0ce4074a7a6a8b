"""File digests used to detect changes and to verify transfers."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

_BUF = 1024 * 1024


@dataclass(frozen=True)
class FileDigest:
    """Digests of a file's content.

    ``md5`` is the hex MD5 of the whole file (the ETag S3 gives a single-part object);
    ``multipart_etag`` the ETag S3 gives it when uploaded in parts of ``part_size`` bytes.
    Either may be None when not asked for.
    """

    size: int
    sha256: str
    md5: str | None = None
    multipart_etag: str | None = None

    @property
    def sha256_b64(self) -> str:
        return base64.b64encode(bytes.fromhex(self.sha256)).decode()


def hash_file(path: Path, *, md5: bool = False, part_size: int | None = None) -> FileDigest:
    """Read ``path`` once, computing SHA-256 and, if asked, MD5 and the multipart ETag."""
    sha = hashlib.sha256()
    whole_md5 = hashlib.md5(usedforsecurity=False) if md5 else None
    part_md5s: list[bytes] = []
    part = hashlib.md5(usedforsecurity=False) if part_size else None
    in_part = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_BUF):
            size += len(chunk)
            sha.update(chunk)
            if whole_md5 is not None:
                whole_md5.update(chunk)
            if part is not None and part_size:
                view = memoryview(chunk)
                while view:
                    take = min(len(view), part_size - in_part)
                    part.update(view[:take])
                    in_part += take
                    view = view[take:]
                    if in_part == part_size:
                        part_md5s.append(part.digest())
                        part = hashlib.md5(usedforsecurity=False)
                        in_part = 0
    multipart = None
    if part is not None:
        if in_part or not part_md5s:
            part_md5s.append(part.digest())
        joined = hashlib.md5(b"".join(part_md5s), usedforsecurity=False).hexdigest()
        multipart = f"{joined}-{len(part_md5s)}"
    return FileDigest(
        size=size,
        sha256=sha.hexdigest(),
        md5=whole_md5.hexdigest() if whole_md5 is not None else None,
        multipart_etag=multipart,
    )
