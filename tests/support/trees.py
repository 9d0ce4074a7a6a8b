"""Sample file trees for the sync tests: write one, read one back (locally or from a bucket)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpulab.datasync.manifest import MANIFEST_NAME

from .s3 import raw_client


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".gpulab-sync")
    }


def remote_tree(endpoint: str, bucket: str, prefix: str = "") -> dict[str, bytes]:
    c = raw_client(endpoint)
    out = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            out[item["Key"]] = c.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return out


def manifest_keys(root: Path) -> set[str]:
    return set(json.loads((root / MANIFEST_NAME).read_text())["objects"])


def sample_files(n: int = 20) -> dict[str, bytes]:
    return {f"dir{i % 4}/sub/file{i}.bin": os.urandom(100 + 37 * i) for i in range(n)}
