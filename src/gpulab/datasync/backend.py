"""The small interface every object store backend implements."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Protocol

from .hashing import FileDigest
from .models import RemoteObject, Transferred

DeleteOutcome = Literal["deleted", "missing", "changed"]


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

    def list(self, prefix: str) -> Iterator[RemoteObject]:
        """All objects whose key starts with ``prefix``."""
        ...

    def download(self, obj: RemoteObject, dest: Path) -> Transferred:
        """Write the object's content to ``dest`` and verify its size and checksum."""
        ...

    def upload(self, key: str, src: Path, digest: FileDigest) -> Transferred:
        """Store ``src`` (whose content has ``digest``) under ``key`` and verify it."""
        ...

    def delete(self, key: str, expected_etag: str) -> DeleteOutcome:
        """Delete ``key`` only if its ETag is still ``expected_etag``."""
        ...

    def part_size_for(self, size: int) -> int | None:
        """Part size the backend uses to upload a file of ``size`` bytes (None: single part)."""
        ...
