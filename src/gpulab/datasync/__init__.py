"""gpulab's sync engine: incremental, verified transfers between object storage and disk.

The names below are loaded on first use (``gpulab-sync --help`` and a bad argument load
neither the engine nor boto3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import Remote
    from .credentials import Credentials, CredentialsError
    from .engine import SyncOptions, pull, push
    from .filesystem import FilesystemRemote
    from .models import Failure, SyncProgress, SyncReport
    from .purging import purge
    from .s3 import S3Remote
    from .s3_settings import S3Settings

_HOMES = {
    "Remote": "backend",
    "Credentials": "credentials",
    "CredentialsError": "credentials",
    "SyncOptions": "engine",
    "pull": "engine",
    "purge": "purging",
    "push": "engine",
    "FilesystemRemote": "filesystem",
    "Failure": "models",
    "SyncProgress": "models",
    "SyncReport": "models",
    "S3Remote": "s3",
    "S3Settings": "s3_settings",
}

__all__ = [
    "Credentials",
    "CredentialsError",
    "Failure",
    "FilesystemRemote",
    "Remote",
    "S3Remote",
    "S3Settings",
    "SyncOptions",
    "SyncProgress",
    "SyncReport",
    "pull",
    "purge",
    "push",
]
assert sorted(__all__) == sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
