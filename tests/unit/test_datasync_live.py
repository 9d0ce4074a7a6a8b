"""A live push (the workload running, maybe writing): the rule as data, then the engine on a
real local tree and the filesystem store, files changed at each step of their reading."""

from __future__ import annotations

import os
import time

import pytest

from gpulab.datasync.cli import main as sync_main
from gpulab.datasync.engine import pull, push
from gpulab.datasync.filesystem import FilesystemRemote
from gpulab.datasync.live import FileState, changed, unsettled
from gpulab.datasync.localtree import LocalRoot
from gpulab.datasync.manifest import MANIFEST_NAME, Locked, Manifest, locked

S = 1_000_000_000  # ns


@pytest.mark.parametrize(
    ("age_s", "settle_s", "left"),
    [(30, 10, None), (10, 10, None), (9.9, 10, "written 9.9 s ago"), (0, 10, "written 0.0 s"),
     (-5, 10, "in the future"), (0, 0, None)],
)  # fmt: skip
def test_a_file_is_taken_once_settled(age_s, settle_s, left):
    now = 1_700_000_000 * S
    why = unsettled(now - int(age_s * S), now, settle_s)
    assert (why is None) if left is None else (left in why)


@pytest.mark.parametrize(
    ("after", "left"),
    [((1, 10, 5), None), ((2, 10, 5), "replaced"), ((1, 11, 5), "size changed (10 -> 11"),
     ((1, 10, 6), "modified")],
)  # fmt: skip
def test_a_file_that_changed_while_read_is_in_flux(after, left):
    why = changed(FileState(1, 10, 5), FileState(*after), "while it was hashed")
    assert (why is None) if left is None else (left in why and "while it was hashed" in why)


def _old(path, age_s: float = 60.0) -> None:
    t = time.time() - age_s
    os.utime(path, (t, t))


def _stored(store, key: str) -> bytes | None:
    path = store / "bkt" / key
    return path.read_bytes() if path.exists() else None


def test_live_push_takes_settled_files_and_leaves_fresh_ones(tmp_path):
    vol, store = tmp_path / "vol", tmp_path / "store"
    vol.mkdir()
    (vol / "old.txt").write_bytes(b"settled")
    _old(vol / "old.txt")
    (vol / "new.txt").write_bytes(b"being written")
    report = push(vol, FilesystemRemote(store, "bkt"), "p", live=True, settle_s=10)
    assert report.ok and report.live and (report.completed, report.in_flux) == (1, 1)
    assert _stored(store, "p/old.txt") == b"settled" and _stored(store, "p/new.txt") is None
    assert any("new.txt: written" in n for n in report.notes)
    with LocalRoot(vol) as root:  # in flux: not in the manifest, so the next push takes it
        assert set(Manifest.load(root, report_identity(store), "p/").entries) == {"p/old.txt"}
    _old(vol / "new.txt")
    again = push(vol, FilesystemRemote(store, "bkt"), "p", live=True, settle_s=10)
    assert (again.completed, again.skipped, again.in_flux) == (1, 1, 0)
    assert _stored(store, "p/new.txt") == b"being written"


def report_identity(store) -> str:
    return FilesystemRemote(store, "bkt").identity


class GrowingWhileHashed(FilesystemRemote):
    """A store whose hashing sees the file grow (a writer appending as the push reads)."""

    def digest(self, path, size):
        with open(path, "ab") as f:  # the /proc/self/fd path: the very file being pushed
            f.write(b" and more")
        return super().digest(path, size)


class ChangedDuringUpload(FilesystemRemote):
    """A store whose upload reads a file changed after it was hashed (same size)."""

    def upload(self, key, src, digest, mode=None):
        with open(src, "r+b") as f:
            f.write(b"X")
        return super().upload(key, src, digest, mode)


@pytest.mark.parametrize("remote_kind", [GrowingWhileHashed, ChangedDuringUpload])
def test_a_file_changed_while_pushed_leaves_the_remote_copy_as_it_was(tmp_path, remote_kind):
    vol, store = tmp_path / "vol", tmp_path / "store"
    vol.mkdir()
    (vol / "ckpt.bin").write_bytes(b"version 1")
    _old(vol / "ckpt.bin")
    assert push(vol, FilesystemRemote(store, "bkt"), "", live=True).completed == 1
    (vol / "ckpt.bin").write_bytes(b"version 2")
    _old(vol / "ckpt.bin")
    report = push(vol, remote_kind(store, "bkt"), "", live=True)
    assert report.ok and (report.completed, report.failed, report.in_flux) == (0, 0, 1)
    assert _stored(store, "ckpt.bin") == b"version 1"  # never the half-read version 2
    assert any("ckpt.bin:" in n and "left for the next push" in n for n in report.notes)
    # the final push (the workload gone) takes the file as it is
    final = push(vol, FilesystemRemote(store, "bkt"), "")
    assert final.ok and _stored(store, "ckpt.bin") == (vol / "ckpt.bin").read_bytes()


def test_live_push_never_deletes_the_final_push_mirrors(tmp_path):
    vol, store = tmp_path / "vol", tmp_path / "store"
    vol.mkdir()
    for name in ("keep.txt", "gone.txt"):
        (vol / name).write_bytes(name.encode())
        _old(vol / name)
    assert push(vol, FilesystemRemote(store, "bkt"), "", "rwd").completed == 2
    (vol / "gone.txt").unlink()
    live = push(vol, FilesystemRemote(store, "bkt"), "", "rwd", live=True)
    assert live.ok and live.deleted == 0 and _stored(store, "gone.txt") == b"gone.txt"
    assert "live push: deletions are mirrored at the final push" in live.notes
    final = push(vol, FilesystemRemote(store, "bkt"), "", "rwd")
    assert final.deleted == 1 and _stored(store, "gone.txt") is None


def test_the_final_push_waits_for_a_live_push_lock(tmp_path):
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "a").write_bytes(b"a")
    remote = FilesystemRemote(tmp_path / "store", "bkt")
    with LocalRoot(vol) as root, locked(root):
        with pytest.raises(Locked):
            push(vol, remote, "")
        began = time.monotonic()
        with pytest.raises(Locked):
            push(vol, remote, "", wait_lock_s=0.3)
        assert time.monotonic() - began >= 0.3
    assert push(vol, remote, "", wait_lock_s=0.3).completed == 1
    assert (vol / MANIFEST_NAME).exists()
    again = tmp_path / "again"
    again.mkdir()
    # a pull waits for the lock too (a live push that began as the workload stopped)
    with LocalRoot(again) as root, locked(root), pytest.raises(Locked):
        pull(remote, again, "", wait_lock_s=0.2)
    assert pull(remote, again, "", wait_lock_s=0.2).completed == 1


def test_the_command_line_says_what_a_live_push_left(tmp_path, capsys):
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "fresh").write_bytes(b"x")
    store = f"file://{tmp_path / 'store'}"
    base = ["push", "--bucket", "bkt", "--local", str(vol), "--store-endpoint", store]
    assert sync_main([*base, "--live", "--settle-seconds", "30"]) == 0
    assert "0 transferred" in capsys.readouterr().out
    assert sync_main([*base, "--live", "--settle-seconds", "0"]) == 0
    assert "1 transferred" in capsys.readouterr().out
    assert sync_main([*base, "--settle-seconds", "5"]) == 2
    assert "--settle-seconds needs --live" in capsys.readouterr().err
    assert sync_main(["pull", "--bucket", "bkt", "--local", str(vol), "--live"]) == 2
    assert sync_main([*base, "--wait-lock", "-1"]) == 2
