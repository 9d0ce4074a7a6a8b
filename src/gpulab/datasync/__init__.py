"""gpulab's sync engine: incremental, verified transfers between object storage and disk."""

from .backend import Remote
from .credentials import Credentials, CredentialsError
from .engine import SyncOptions, pull, purge, push
from .filesystem import FilesystemRemote
from .models import Failure, SyncProgress, SyncReport
from .s3 import S3Remote, S3Settings

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
