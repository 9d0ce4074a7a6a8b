"""The sync engine against the embedded filesystem object store."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpulab.datasync import FilesystemRemote, SyncOptions, pull, purge, push

from ..support.trees import manifest_keys, read_tree, sample_files, write_tree


def store_tree(root: Path, bucket: str) -> dict[str, bytes]:
    return read_tree(root / bucket)


def test_round_trip_and_incremental(tmp_path):
    files = sample_files(25)
    write_tree(tmp_path / "a", files)
    remote = FilesystemRemote(tmp_path / "store", "datasets")
    rep = push(tmp_path / "a", remote, "ws/alice", "rw")
    assert (rep.completed, rep.failed) == (25, 0)
    assert store_tree(tmp_path / "store", "datasets") == {
        f"ws/alice/{k}": v for k, v in files.items()
    }
    sidecar = tmp_path / "store/.gpulab-meta/datasets/ws/alice/dir0/sub/file0.bin.json"
    assert json.loads(sidecar.read_text())["size"] == len(files["dir0/sub/file0.bin"])
    assert push(tmp_path / "a", remote, "ws/alice", "rw").skipped == 25
    rep = pull(remote, tmp_path / "b", "ws/alice")
    assert rep.completed == 25 and read_tree(tmp_path / "b") == files
    again = pull(remote, tmp_path / "b", "ws/alice")
    assert (again.completed, again.skipped) == (0, 25)
    assert not list((tmp_path / "store").rglob(".gpulab-sync-tmp-*"))


def test_missing_bucket_created_on_pull(tmp_path):
    remote = FilesystemRemote(tmp_path / "store", "fresh-bucket")
    rep = pull(remote, tmp_path / "out")
    assert rep.ok and rep.objects_total == 0 and (tmp_path / "store/fresh-bucket").is_dir()


def test_rw_and_rwd(tmp_path):
    write_tree(tmp_path / "a", {"keep.txt": b"k", "gone.txt": b"g"})
    remote = FilesystemRemote(tmp_path / "store", "bkt")
    push(tmp_path / "a", remote, "", "rwd")
    (tmp_path / "store/bkt/foreign.txt").write_bytes(b"f")  # never seen locally
    (tmp_path / "a/gone.txt").unlink()
    assert push(tmp_path / "a", remote, "", "rw").deleted == 0
    assert (tmp_path / "store/bkt/gone.txt").exists()
    rep = push(tmp_path / "a", remote, "", "rwd")
    assert rep.deleted == 1
    assert store_tree(tmp_path / "store", "bkt") == {"keep.txt": b"k", "foreign.txt": b"f"}
    assert manifest_keys(tmp_path / "a") == {"keep.txt"}
    assert push(tmp_path / "a", remote, "", "ro").objects_total == 0


def test_corrupted_object_detected_and_local_kept(tmp_path):
    write_tree(tmp_path / "src", {"m.bin": b"good" * 100})
    remote = FilesystemRemote(tmp_path / "store", "bkt")
    push(tmp_path / "src", remote)
    pull(remote, tmp_path / "work")
    (tmp_path / "src/m.bin").write_bytes(b"second version")
    push(tmp_path / "src", remote)
    obj = tmp_path / "store/bkt/m.bin"  # bit rot: content no longer matches its sidecar
    obj.write_bytes(b"second versioN")
    rep = pull(remote, tmp_path / "work", options=SyncOptions(attempts=2, backoff_s=0))
    assert (rep.failed, rep.completed) == (1, 0)
    assert "checksum" in rep.failures[0].reason
    assert (tmp_path / "work/m.bin").read_bytes() == b"good" * 100
    assert not list((tmp_path / "work").glob(".gpulab-sync-tmp-*"))


def test_manifest_of_another_remote_is_not_trusted(tmp_path):
    write_tree(tmp_path / "a", {"x.txt": b"x"})
    push(tmp_path / "a", FilesystemRemote(tmp_path / "store", "one"))
    rep = push(tmp_path / "a", FilesystemRemote(tmp_path / "store", "two"))
    assert rep.completed == 1 and any("another remote" in n for n in rep.notes)
    assert (tmp_path / "store/two/x.txt").read_bytes() == b"x"


def test_unchanged_5000_files_push_is_fast(tmp_path):
    """The 'nothing changed' path stats files and reads the manifest; it hashes nothing."""
    root = tmp_path / "many"
    for i in range(5000):
        d = root / f"d{i % 50}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(b"x")
    remote = FilesystemRemote(tmp_path / "store", "bkt")
    assert push(root, remote, "", "rw", options=SyncOptions(workers=8)).completed == 5000
    rep = push(root, remote, "", "rw")
    assert (rep.skipped, rep.completed) == (5000, 0)
    assert rep.elapsed_s < 1.0, rep.elapsed_s
    os.utime(root / "d0/f0")  # only the mtime changes: hashed, not uploaded
    rep = push(root, remote, "", "rw")
    assert (rep.skipped, rep.completed) == (5000, 0)


def test_purge(tmp_path):
    files = {f"data/run{i % 3}/f{i}.bin": b"x" * i for i in range(10)}
    files |= {"data-old/keep.bin": b"k", "datax": b"k", "other/data/keep.bin": b"k"}
    write_tree(tmp_path / "a", files)
    remote = FilesystemRemote(tmp_path / "store", "bkt")
    assert push(tmp_path / "a", remote).completed == 13
    with pytest.raises(ValueError, match="empty prefix"):
        purge(remote, "/")
    rep = purge(remote, "data", options=SyncOptions(workers=2))
    assert rep.ok and (rep.objects_total, rep.deleted) == (10, 10)
    assert store_tree(tmp_path / "store", "bkt") == {
        "data-old/keep.bin": b"k",
        "datax": b"k",
        "other/data/keep.bin": b"k",
    }
    assert not (tmp_path / "store/bkt/data").exists()  # emptied directories are removed
    assert not (tmp_path / "store/.gpulab-meta/bkt/data").exists()  # and the sidecars
    assert (tmp_path / "store/.gpulab-meta/bkt/datax.json").exists()
    assert purge(remote, "data").objects_total == 0


@pytest.mark.parametrize("hashers", [1, 3])
def test_push_hashes_at_most_hashers_large_files_at_once(tmp_path, monkeypatch, hashers):
    """Large files are hashed ``hashers`` at a time, so that the first is sent while the
    others wait instead of all sharing the CPUs; small files are never held back."""
    from gpulab.datasync import engine

    monkeypatch.setattr(engine, "LARGE_FILE", 1024)
    write_tree(tmp_path / "a", {f"big{i}.bin": os.urandom(4096) for i in range(6)})
    write_tree(tmp_path / "a", {f"small{i}.bin": b"s" for i in range(6)})
    remote = FilesystemRemote(tmp_path / "store", "bkt")
    real = remote.digest
    lock, running, peak = threading.Lock(), {"large": 0, "all": 0}, {"large": 0, "all": 0}

    def slow_digest(path, size):
        kinds = ("large", "all") if size >= 1024 else ("all",)
        with lock:
            for k in kinds:
                running[k] += 1
                peak[k] = max(peak[k], running[k])
        time.sleep(0.15)
        with lock:
            for k in kinds:
                running[k] -= 1
        return real(path, size)

    monkeypatch.setattr(remote, "digest", slow_digest)
    rep = push(tmp_path / "a", remote, "", "rw", options=SyncOptions(workers=8, hashers=hashers))
    assert (rep.completed, rep.failed) == (12, 0)
    assert peak["large"] == hashers
    assert peak["all"] > hashers  # the small files hashed beside them
