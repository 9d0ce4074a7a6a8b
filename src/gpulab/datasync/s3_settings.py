"""The S3 client's settings, apart from the client (so that reading them loads no botocore)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MiB = 1024 * 1024


@dataclass(frozen=True)
class S3Settings:
    """Client tuning. Objects of ``multipart_threshold`` bytes or more use ranged/multipart
    transfers of ``multipart_chunksize`` parts with ``transfer_concurrency`` threads each.

    Smaller objects take one request each, hashed as they stream: the engine already keeps
    ``workers`` objects in flight, so splitting objects only pays off for very large ones
    (and costs a second pass over the file to verify a download, parts arriving out of order).
    """

    retry_mode: Literal["standard", "adaptive"] = "standard"
    max_attempts: int = 5
    max_pool_connections: int = 64
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    multipart_threshold: int = 512 * MiB
    multipart_chunksize: int = 64 * MiB
    transfer_concurrency: int = 8
    addressing_style: Literal["auto", "path", "virtual"] = "path"
