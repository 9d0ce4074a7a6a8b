"""The local side of a sync: key <-> path mapping, tree scan, atomic file placement."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .models import UnsafeKey

#: Names starting with this are the engine's own files (manifest, lock, temp files).
RESERVED_PREFIX = ".gpulab-sync"


def normalize_prefix(prefix: str) -> str:
    """``"/a/b/"`` -> ``"a/b/"``; ``""`` stays ``""``. Keys are ``<prefix><relative path>``."""
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"invalid prefix {prefix!r}: empty, '.' or '..' segment")
    return f"{prefix}/" if prefix else ""


def key_to_relpath(key: str, prefix: str) -> str:
    """Relative local path of ``key`` (under normalised ``prefix``); raises UnsafeKey."""
    if not key.startswith(prefix):
        raise UnsafeKey(f"key {key!r} is outside prefix {prefix!r}")
    rel = key[len(prefix) :]
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise UnsafeKey(f"key {key!r} cannot be a local path (empty, '.' or '..' segment)")
    if any(p.startswith(RESERVED_PREFIX) for p in parts):
        raise UnsafeKey(f"key {key!r} uses the reserved name {RESERVED_PREFIX}*")
    return rel


@dataclass(frozen=True)
class LocalFile:
    key: str
    path: str
    size: int
    mtime_ns: int


def scan(root: Path, prefix: str) -> Iterator[LocalFile]:
    """Yield the regular files under ``root`` (symlinks and the engine's files are skipped)."""
    stack = [(str(root), "")]
    while stack:
        directory, rel = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.name.startswith(RESERVED_PREFIX):
                continue
            relpath = f"{rel}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, relpath + "/"))
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                yield LocalFile(prefix + relpath, entry.path, st.st_size, st.st_mtime_ns)


def temp_path_for(dest: Path) -> Path:
    """A unique temporary name next to ``dest`` (same filesystem, so rename is atomic)."""
    return dest.parent / f"{RESERVED_PREFIX}-tmp-{os.getpid()}-{os.urandom(6).hex()}"
