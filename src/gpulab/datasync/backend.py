"""The small interface every object store backend implements."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol

from .hashing import FileDigest
from .models import RemoteObject, Transferred

DeleteOutcome = Literal["deleted", "missing", "changed"]

#: Most keys one :meth:`Remote.delete_many` call takes (S3's DeleteObjects limit).
DELETE_BATCH = 1000


class Remote(Protocol):
    """One bucket on an object store.

    Backends raise :class:`~gpulab.datasync.models.RemoteUnavailable` when the store cannot
    be reached and :class:`~gpulab.datasync.models.IntegrityError` when a transfer cannot be
    verified; anything else is reported as a failed object.
    """

    bucket: str

    @property
    def identity(self) -> str:
        """Where the bucket lives, without credentials (ties a manifest to its remote)."""
        ...

    def ensure_bucket(self) -> bool:
        """Create the bucket if missing; return True if it was created."""
        ...

    def list(self, prefix: str, *, markers: bool = False) -> Iterator[RemoteObject]:
        """All objects whose key starts with ``prefix``.

        Keys ending in ``/`` (empty "directory" markers some tools create) are left out
        unless ``markers``."""
        ...

    def download(self, obj: RemoteObject, dest: Path, fd: int | None = None) -> Transferred:
        """Write the object's content to ``dest`` and verify its size and checksum; the
        answer says the mode the object carries and whether it is a symbolic link (whose
        content is then its target), as :meth:`upload` and :meth:`upload_link` stored them
        (none and no for an object without that metadata).

        ``fd``, when given, is an open, empty, writable descriptor of ``dest``: the engine's
        temporary file, created without following links. Backends write through it (see
        :func:`.hashing.open_target`), and open the name only where they must (a library
        that takes a name): the name resolves to that same file."""
        ...

    def upload(
        self, key: str, src: Path, digest: FileDigest, mode: int | None = None
    ) -> Transferred:
        """Store ``src`` (whose content has ``digest``) under ``key`` and verify it;
        ``mode``: the permission bits kept with it (metadata)."""
        ...

    def upload_link(self, key: str, target: bytes) -> Transferred:
        """Store a symbolic link under ``key``: an object whose content is ``target`` and
        whose metadata says it is a link, verified as :meth:`upload` verifies a file."""
        ...

    def delete(self, key: str, expected_etag: str) -> DeleteOutcome:
        """Delete ``key`` only if its ETag is still ``expected_etag``."""
        ...

    def delete_many(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """Delete ``keys`` unconditionally (at most :data:`DELETE_BATCH` per call); return
        ``(key, reason)`` for each key that could not be deleted. A missing key is deleted."""
        ...

    def digest(self, path: Path, size: int) -> FileDigest:
        """Hash ``path`` (of ``size`` bytes) as :meth:`upload` needs it."""
        ...

    def part_size_for(self, size: int) -> int | None:
        """Part size the backend uses to upload a file of ``size`` bytes (None: single part)."""
        ...
