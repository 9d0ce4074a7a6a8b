"""Data types shared by the sync engine, its backends and its command line."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Operation = Literal["pull", "push", "purge"]


class SyncError(Exception):
    """Base class of the errors the engine reports per object."""


class IntegrityError(SyncError):
    """A transferred object's size or checksum did not match what the other side reported."""


class RemoteUnavailable(SyncError):
    """The object store could not be reached (after the client's own retries)."""


#: OpenSSL's words in a failed handshake, as Python's ssl module writes them
_SSL_RE = re.compile(r"\[SSL: ([A-Z_]+)\] ([^(\]\n]+)")


def tls_refusal(exc: BaseException | str) -> str:
    """A sentence naming the certificate problem when ``exc`` is a failed TLS handshake with
    the store (its certificate not verified, most often signed by a CA the client does not
    trust), else ''."""
    found = _SSL_RE.search(str(exc))
    if not found:
        return ""
    code, words = found.group(1), found.group(2).strip()
    hint = ""
    if code == "CERTIFICATE_VERIFY_FAILED" and ("issuer" in words or "self" in words):
        hint = (
            ": the store's certificate is not signed by a CA this client trusts (a private "
            "CA? give the store its ca_bundle)"
        )
    return f"TLS handshake with the store failed, {words} [{code}]{hint}"


class UnsafeKey(SyncError):
    """An object key cannot be mapped safely to a local path (e.g. contains '..')."""


class Conflict(SyncError):
    """Both the local file and the remote object changed since the last sync."""


@dataclass(frozen=True)
class RemoteObject:
    """One object as listed by a backend. ``etag`` is an opaque change token."""

    key: str
    size: int
    etag: str


@dataclass(frozen=True)
class Transferred:
    """What a backend verified about one transferred object."""

    key: str
    size: int
    etag: str
    sha256: str
    #: the permission bits the object carries (``gpulab-mode``), None if it has none (an
    #: object written before modes were kept, or by another tool)
    mode: int | None = None
    #: the object is a symbolic link (``gpulab-type: symlink``): its body is the target
    link: bool = False


@dataclass
class SyncProgress:
    """Counters of a sync in progress (``processed`` = completed + skipped + failed + deleted)."""

    objects_total: int = 0
    processed: int = 0
    completed: int = 0
    skipped: int = 0
    failed: int = 0
    deleted: int = 0
    bytes_transferred: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"event": "progress", **asdict(self)}


@dataclass(frozen=True)
class Failure:
    """An object that was not synced, and why."""

    key: str
    reason: str


@dataclass
class SyncReport:
    """The outcome of one pull, push or purge.

    JSON-serialisable via :meth:`to_dict` / :meth:`to_json`."""

    operation: Operation
    bucket: str
    prefix: str
    mode: str
    objects_total: int = 0
    processed: int = 0
    completed: int = 0
    skipped: int = 0
    failed: int = 0
    deleted: int = 0
    bytes_transferred: int = 0
    failures: list[Failure] = field(default_factory=list)
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: a live push (the workload running: see :mod:`.live`)
    live: bool = False
    #: files a live push left alone (written too recently, or changed while read): counted
    #: in ``skipped`` too, never in the manifest
    in_flux: int = 0

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return {"event": "report", **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)
