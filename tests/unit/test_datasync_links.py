"""Links planted in a volume never make the sync engine write, read or delete outside it.

The local directory of a sync belongs to an untrusted workload. Each test plants what a
hostile job could (a link at the engine's own file names, a linked directory on a pull's
path, a link as a pull's destination, a link for ``--delete`` to follow, a FIFO) and checks
that a file outside the volume, the "victim", is byte-identical afterwards. The embedded
filesystem store is real; no engine is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from gpulab.datasync import FilesystemRemote, pull, push
from gpulab.datasync.localtree import MAX_DEPTH, LocalRoot
from gpulab.datasync.manifest import LOCK_NAME, MANIFEST_NAME

from ..conftest import _need

SECRET = b"the victim's train.py: must never change\n"


@pytest.fixture(autouse=True, params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Every test twice: paths opened in one openat2 call where the kernel has it, and one
    component at a time (old kernels, seccomp profiles without openat2)."""
    from gpulab.datasync.localtree import openat2

    if request.param == "walk":
        monkeypatch.setattr(openat2, "available", False)
    else:
        root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fd = openat2(root, "tmp", os.O_RDONLY | os.O_DIRECTORY)
        finally:
            os.close(root)
        if fd is None:  # a skip on a developer's machine, a failure in CI
            _need("this kernel (or its seccomp profile) has no openat2")
        os.close(fd)
    return request.param


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every volume and outside the store prefix of the sync under test."""
    path = tmp_path / "victim" / "train.py"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def stored(store: Path, bucket: str = "bkt") -> dict[str, bytes]:
    top = store / bucket
    return {
        p.relative_to(top).as_posix(): p.read_bytes()
        for p in top.rglob("*")
        if p.is_file() and not p.name.startswith(".gpulab-sync")
    }


def reasons(report) -> str:
    return " | ".join(f"{f.key}: {f.reason}" for f in report.failures)


def test_push_never_writes_the_manifest_through_a_link(tmp_path, victim):
    """The exact attack seen on main: a link at the manifest's temp name (``.tmp-<pid>``)
    and one at the manifest itself; the push's manifest JSON used to land in the victim."""
    vol = tmp_path / "vol"
    tree(vol, {"out/model.pt": b"weights"})
    (vol / f"{MANIFEST_NAME}.tmp-{os.getpid()}").symlink_to(victim)
    (vol / f"{MANIFEST_NAME}.tmp-1").symlink_to(victim)
    remote = FilesystemRemote(tmp_path / "store", "bkt")
    report = push(vol, remote, "alice/run1")
    assert report.ok and report.completed == 1, reasons(report)
    assert victim.read_bytes() == SECRET
    # the manifest was written as a file of the volume, and a second push finds it
    (vol / MANIFEST_NAME).unlink()
    (vol / MANIFEST_NAME).symlink_to(victim)
    again = push(vol, remote, "alice/run1")
    assert again.ok and victim.read_bytes() == SECRET
    assert any("symbolic link" in n for n in again.notes), again.notes
    assert not (vol / MANIFEST_NAME).is_symlink()
    assert json.loads((vol / MANIFEST_NAME).read_text())["prefix"] == "alice/run1/"
    assert stored(tmp_path / "store") == {"alice/run1/out/model.pt": b"weights"}


def test_manifest_link_is_not_read_on_pull(tmp_path, victim):
    """A manifest that is a link is ignored (starts empty, with a note), never read."""
    store = tmp_path / "store"
    tree(tmp_path / "src", {"a.txt": b"a"})
    remote = FilesystemRemote(store, "bkt")
    assert push(tmp_path / "src", remote, "p").ok
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / MANIFEST_NAME).symlink_to(victim)
    report = pull(remote, vol, "p")
    assert report.ok and report.completed == 1, reasons(report)
    assert any("symbolic link" in n for n in report.notes), report.notes
    assert victim.read_bytes() == SECRET and (vol / "a.txt").read_bytes() == b"a"
    assert json.loads((vol / MANIFEST_NAME).read_text())["objects"].keys() == {"p/a.txt"}


def test_lock_link_is_never_followed(tmp_path, victim):
    """A dangling link at the lock's name used to create the file it names, anywhere."""
    vol = tmp_path / "vol"
    tree(vol, {"a.txt": b"a"})
    target = victim.parent / "created-by-the-sync"
    (vol / LOCK_NAME).symlink_to(target)
    report = push(vol, FilesystemRemote(tmp_path / "store", "bkt"), "p")
    assert report.ok, reasons(report)
    assert not target.exists() and not target.is_symlink()
    assert sorted(p.name for p in victim.parent.iterdir()) == ["train.py"]
    assert victim.read_bytes() == SECRET
    assert (vol / LOCK_NAME).is_file() and not (vol / LOCK_NAME).is_symlink()


def test_fifo_or_directory_at_the_engine_names_neither_blocks_nor_breaks(tmp_path):
    """A FIFO at the manifest's name used to block the pull for ever; a directory there
    made saving the manifest fail. Both are removed (reserved names), the sync goes on."""
    store = tmp_path / "store"
    tree(tmp_path / "src", {"a.txt": b"a"})
    remote = FilesystemRemote(store, "bkt")
    assert push(tmp_path / "src", remote, "p").ok
    vol = tmp_path / "vol"
    vol.mkdir()
    os.mkfifo(vol / MANIFEST_NAME)
    (vol / LOCK_NAME).mkdir()
    (vol / LOCK_NAME / "x").write_bytes(b"x")
    result: list = []
    worker = threading.Thread(target=lambda: result.append(pull(remote, vol, "p")), daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # unblock the old code's read of the FIFO, then fail
        with open(vol / MANIFEST_NAME, "wb"):
            pass
        pytest.fail("pull blocked on a FIFO planted at the manifest's name")
    report = result[0]
    assert report.ok and report.completed == 1, reasons(report)
    assert (vol / MANIFEST_NAME).is_file() and (vol / LOCK_NAME).is_file()
    (vol / MANIFEST_NAME).unlink()
    (vol / MANIFEST_NAME).mkdir()
    again = push(vol, remote, "p")
    assert again.ok and (vol / MANIFEST_NAME).is_file(), reasons(again)


def test_pull_never_writes_through_a_linked_directory(tmp_path, victim):
    """``d`` is a link to the victim's directory and the store has ``d/train.py``: the pull
    reports the link in the way and writes nothing there (it used to create files in the
    victim's directory, and replace theirs if the manifest said so)."""
    store = tmp_path / "store"
    tree(tmp_path / "src", {"d/train.py": b"attacker's content", "d/new.txt": b"n", "ok.txt": b"o"})
    remote = FilesystemRemote(store, "bkt")
    assert push(tmp_path / "src", remote, "p").ok
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "d").symlink_to(victim.parent, target_is_directory=True)
    report = pull(remote, vol, "p")
    assert report.failed == 2 and report.completed == 1
    assert all(
        "d: something other than a directory is in the way" in f.reason for f in report.failures
    ), reasons(report)
    assert victim.read_bytes() == SECRET
    assert sorted(p.name for p in victim.parent.iterdir()) == ["train.py"]
    # a regular file where a directory is needed is reported the same way
    (vol / "d").unlink()
    (vol / "d").write_bytes(b"a file")
    report = pull(remote, vol, "p")
    assert report.failed == 2 and "something other than a directory" in reasons(report)


def test_pull_never_writes_through_a_linked_destination(tmp_path, victim):
    """The destination itself is a link to the victim: reported, neither read nor replaced."""
    store = tmp_path / "store"
    tree(tmp_path / "src", {"train.py": b"attacker's content"})
    remote = FilesystemRemote(store, "bkt")
    assert push(tmp_path / "src", remote, "p").ok
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "train.py").symlink_to(victim)
    report = pull(remote, vol, "p")
    assert report.failed == 1, reasons(report)
    assert "something other than a file is in the way" in reasons(report)
    assert victim.read_bytes() == SECRET and (vol / "train.py").is_symlink()


def test_pull_delete_never_follows_a_linked_directory(tmp_path, victim):
    """``--delete`` removes a local file whose object is gone if it is still the synced one.
    The workload owns the manifest too: it lists the victim's size and mtime under ``d/``,
    then makes ``d`` a link to the victim's directory. The victim used to be deleted."""
    store = tmp_path / "store"
    tree(tmp_path / "src", {"keep.txt": b"k"})
    remote = FilesystemRemote(store, "bkt")
    assert push(tmp_path / "src", remote, "p").ok
    vol = tmp_path / "vol"
    assert pull(remote, vol, "p").ok
    manifest = json.loads((vol / MANIFEST_NAME).read_text())
    st = victim.stat()
    manifest["objects"]["p/d/train.py"] = [st.st_size, "x", "y", st.st_mtime_ns]
    manifest["objects"]["p/train.py"] = [st.st_size, "x", "y", st.st_mtime_ns]
    (vol / MANIFEST_NAME).write_text(json.dumps(manifest))
    (vol / "d").symlink_to(victim.parent, target_is_directory=True)
    (vol / "train.py").symlink_to(victim)
    report = pull(remote, vol, "p", delete=True)
    assert report.ok, reasons(report)
    assert victim.read_bytes() == SECRET
    assert (vol / "d").is_symlink() and (vol / "keep.txt").read_bytes() == b"k"
    assert report.deleted == 0 and any("not deleted locally" in n for n in report.notes)


def test_push_uploads_neither_links_nor_files_below_linked_directories(tmp_path, victim):
    vol = tmp_path / "vol"
    tree(vol, {"real/a.txt": b"a"})
    (vol / "link.py").symlink_to(victim)
    (vol / "ldir").symlink_to(victim.parent, target_is_directory=True)
    (vol / "real" / "inner").symlink_to(victim.parent, target_is_directory=True)
    store = tmp_path / "store"
    report = push(vol, FilesystemRemote(store, "bkt"), "p", "rwd")
    assert report.ok and report.completed == 1, reasons(report)
    assert stored(store) == {"p/real/a.txt": b"a"}
    assert victim.read_bytes() == SECRET


def test_push_reports_a_tree_deeper_than_the_limit(tmp_path):
    """Scanning holds one descriptor per level: a tree deeper than MAX_DEPTH is reported
    (and its already synced objects are not deleted by rwd), not a crash."""
    vol = tmp_path / "vol"
    deep = vol
    for _ in range(MAX_DEPTH + 2):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"f")
    (vol / "top.txt").write_bytes(b"t")
    report = push(vol, FilesystemRemote(tmp_path / "store", "bkt"), "p", "rwd")
    assert report.completed == 1 and report.failed == 1
    assert f"deeper than {MAX_DEPTH}" in reasons(report)


def test_local_root_walks_without_following(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"f")
    (tmp_path / "ln").symlink_to(tmp_path / "real", target_is_directory=True)
    with LocalRoot(tmp_path) as root:
        fd = root.open_file("real/f")
        os.close(fd)
        from gpulab.datasync.localtree import InTheWay

        with pytest.raises(InTheWay, match="ln: something other than a directory"):
            root.open_file("ln/f")
        with pytest.raises(InTheWay, match="something other than a file"):
            root.open_file("ln")
        with pytest.raises(FileNotFoundError):
            root.open_file("missing/f")
        with root.parent_of("new/sub/f", create=True) as (dirfd, name):
            assert name == "f" and os.fstat(dirfd).st_ino == (tmp_path / "new/sub").stat().st_ino


# -- the sync helper's view of a filesystem store ------------------------------------------


def helper(operation: str, prefix: str = "ws/alice/nb", mode: str = "rwd") -> dict:
    from gpulab.data.helper import sync_helper_spec
    from gpulab.runtime.objects import helper_container_config

    return helper_container_config(
        sync_helper_spec(
            image="gpulab/sync:1",
            operation=operation,
            bucket="bkt",
            prefix=prefix,
            mode=mode,
            docker_volume=None if operation == "purge" else "vol",
            store_kind="filesystem",
            store_root="/srv/objects",
            endpoint_url=None,
            region="us-east-1",
            labels={},
            environment={},
        )
    )


@pytest.mark.parametrize(
    ("operation", "mode", "store_mode"),
    [
        ("pull", "ro", "ro"),
        ("pull", "rwd", "ro"),  # a pull only reads the store
        ("push", "rw", "rw"),
        ("push", "rwd", "rw"),
        ("push", "ro", "ro"),
        ("purge", "rw", "rw"),
    ],
)
def test_helper_binds_only_the_volumes_own_store_directories(operation, mode, store_mode):
    binds = helper(operation, mode=mode)["host_config"]["binds"]
    store_binds = {k: v for k, v in binds.items() if k != "vol"}
    assert store_binds == {
        "/srv/objects/bkt/ws/alice/nb": {"bind": "/store/bkt/ws/alice/nb", "mode": store_mode},
        "/srv/objects/.gpulab-meta/bkt/ws/alice/nb": {
            "bind": "/store/.gpulab-meta/bkt/ws/alice/nb",
            "mode": store_mode,
        },
    }
    assert all(v["bind"] != "/store" for v in binds.values())
    assert ("vol" in binds) == (operation != "purge")


def test_helper_binds_the_bucket_for_an_empty_prefix_and_refuses_unsafe_ones():
    binds = helper("pull", prefix="")["host_config"]["binds"]
    assert binds["/srv/objects/bkt"] == {"bind": "/store/bkt", "mode": "ro"}
    assert binds["/srv/objects/.gpulab-meta/bkt"]["bind"] == "/store/.gpulab-meta/bkt"
    for bad in ["a/../b", "..", "a//b", "./a"]:
        with pytest.raises(ValueError, match="unsafe store location"):
            helper("pull", prefix=bad)


def fs_store(root: Path):
    from gpulab.volumes import ObjectStore

    return ObjectStore(name="local", kind="filesystem", root=str(root))


def spec(prefix: str, bucket: str = "bkt"):
    from gpulab.volumes import VolumeSpec

    return VolumeSpec(bucket=bucket, store="local", prefix=prefix, mount="/data", mode="rw")


def test_prepare_store_dirs_makes_both_directories(tmp_path):
    from gpulab.data.sync import prepare_store_dirs

    root = tmp_path / "objects"
    assert prepare_store_dirs(fs_store(root), spec("ws/alice/nb")) == str(root)
    assert (root / "bkt/ws/alice/nb").is_dir()
    assert (root / ".gpulab-meta/bkt/ws/alice/nb").is_dir()
    if os.geteuid() == 0:  # the helper's user owns what it writes in
        assert (root / "bkt/ws/alice/nb").stat().st_uid == 1000
        assert (root / ".gpulab-meta/bkt/ws/alice/nb").stat().st_gid == 100
    # again: nothing to do; an empty prefix gives the bucket's directories
    assert prepare_store_dirs(fs_store(root), spec("ws/alice/nb")) == str(root)
    assert prepare_store_dirs(fs_store(root), spec("", bucket="other")) == str(root)
    assert (root / "other").is_dir() and (root / ".gpulab-meta/other").is_dir()


@pytest.mark.parametrize("where", ["bkt/ws", ".gpulab-meta/bkt", "bkt/ws/alice/nb"])
def test_prepare_store_dirs_refuses_a_link_on_the_path(tmp_path, victim, where):
    """A link anywhere on a volume's path in the store (on the host) would make Docker bind
    whatever it points to: the sync fails clearly instead, nothing is made through it."""
    from gpulab.data.sync import StoreLayoutError, prepare_store_dirs

    root = tmp_path / "objects"
    (root / where).parent.mkdir(parents=True)
    (root / where).symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(StoreLayoutError, match=f"{where} is a symbolic link or not a directory"):
        prepare_store_dirs(fs_store(root), spec("ws/alice/nb"))
    assert sorted(p.name for p in victim.parent.iterdir()) == ["train.py"]


# -- the S3 backend through descriptor paths (moto's S3 server on loopback) -----------------

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def s3():
    from ..support.s3 import MotoS3Server

    with MotoS3Server() as srv:
        yield srv


def test_s3_multipart_and_ranged_transfers_work_through_descriptor_paths(
    s3, tmp_path, victim, monkeypatch
):
    """Above the multipart threshold boto3 uploads in parts (opening the file once per part)
    and downloads in ranges to ``<dest>.<random>`` renamed to ``dest``: both work through
    the ``/proc/self/fd`` paths the engine hands it; planted links still change nothing."""
    from gpulab.datasync import Credentials, S3Remote, S3Settings

    from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY

    remote = S3Remote(
        "links-mp",
        endpoint_url=s3.endpoint,
        credentials=Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY),
        settings=S3Settings(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB),
        store_name="test",
    )
    paths: list[str] = []
    for name in ("upload_file", "download_file"):
        real = getattr(remote.client, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            paths.append(f"{_name} {args[0] if _name == 'upload_file' else args[2]}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(remote.client, name, spy)

    big, small = os.urandom(11 * MiB + 7), b"small"
    vol = tmp_path / "vol"
    tree(vol, {"model/weights.bin": big, "small.txt": small})
    (vol / f"{MANIFEST_NAME}.tmp-{os.getpid()}").symlink_to(victim)
    (vol / "ldir").symlink_to(victim.parent, target_is_directory=True)
    report = push(vol, remote, "p")
    assert report.ok and report.completed == 2, reasons(report)
    head = remote.client.head_object(Bucket="links-mp", Key="p/model/weights.bin")
    assert head["ETag"].strip('"').endswith("-3")  # really uploaded in 3 parts
    assert victim.read_bytes() == SECRET

    # a pull through a planted directory link fails that object, the others arrive
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "model").symlink_to(victim.parent, target_is_directory=True)
    report = pull(remote, linked, "p")
    assert report.failed == 1 and "model: something other than a directory" in reasons(report)
    assert sorted(p.name for p in victim.parent.iterdir()) == ["train.py"]
    assert victim.read_bytes() == SECRET

    clean = tmp_path / "clean"
    report = pull(remote, clean, "p")
    assert report.ok and report.completed == 2, reasons(report)
    assert (clean / "model/weights.bin").read_bytes() == big
    assert (clean / "small.txt").read_bytes() == small
    assert sorted(p.name for p in (clean / "model").iterdir()) == ["weights.bin"]  # no temp
    assert any(p.startswith("upload_file /proc/self/fd/") for p in paths), paths
    assert any(p.startswith("download_file /proc/self/fd/") for p in paths), paths


# -- links and modes kept (a home: ``links=True``) ------------------------------------------


def test_mode_and_link_rules_as_data():
    from gpulab.datasync import filesystem, s3
    from gpulab.datasync.localtree import (
        MAX_LINK_TARGET,
        UnsafeLink,
        check_link_target,
        restored_mode,
        stored_mode,
    )

    assert stored_mode(0o100755) == 0o755 and stored_mode(0o104755) == 0o755  # no setuid
    assert stored_mode(0o102775) == 0o775 and stored_mode(0o101777) == 0o777  # setgid, sticky
    assert restored_mode(0o7777) == 0o777 and restored_mode(0o4755) == 0o755
    assert restored_mode(0o000) == 0o400 and restored_mode(0o044) == 0o444  # owner reads
    assert check_link_target(b"../../", "k") == b"../../"
    assert check_link_target(b"x" * MAX_LINK_TARGET, "k")
    for bad, why in [(b"", "empty"), (b"a\0b", "NUL"), (b"x" * 4097, "more than 4096")]:
        with pytest.raises(UnsafeLink, match=why):
            check_link_target(bad, "k")
    assert s3.meta_fields({"gpulab-mode": "755"}) == (0o755, False)
    assert s3.meta_fields({"gpulab-type": "symlink"}) == (None, True)
    for junk in ["", "9", "0x1ff", "-1", "77777", "rwx"]:
        assert s3.meta_fields({"gpulab-mode": junk, "gpulab-type": "file"}) == (None, False)
    assert s3.meta_fields(None) == (None, False)
    assert filesystem.meta_fields({"mode": 0o4755, "type": "symlink"}) == (0o4755, True)
    for junk in [True, -1, 0o10000, "755", None]:
        assert filesystem.meta_fields({"mode": junk}) == (None, False)
    assert filesystem.meta_fields(["mode"]) == (None, False)


def test_manifest_entries_of_older_versions_read_as_plain_files(tmp_path):
    from gpulab.datasync.manifest import Entry, Manifest

    (tmp_path / MANIFEST_NAME).write_text(
        json.dumps(
            {"version": 1, "remote": "r", "prefix": "p/", "objects": {"p/a": [1, "e", "s", 5]}}
        )
    )
    with LocalRoot(tmp_path) as root:
        m = Manifest.load(root, "r", "p/")
        assert m.entries == {"p/a": Entry(1, "e", "s", 5, 0o644, False)}
        m.set("p/b", Entry(3, "e2", "s2", 6, 0o755))
        m.set("p/l", Entry(4, "e3", "s3", 7, 0, link=True))
        m.save()
        again = Manifest.load(root, "r", "p/")
    assert again.entries == m.entries
    saved = json.loads((tmp_path / MANIFEST_NAME).read_text())["objects"]
    assert saved == {"p/a": [1, "e", "s", 5, 0o644], "p/b": [3, "e2", "s2", 6, 0o755],
                     "p/l": [4, "e3", "s3", 7, 0, 1]}  # fmt: skip


def home_tree(vol: Path, victim: Path) -> dict[str, tuple[str, object, int]]:
    """A home as a researcher leaves it; the expected restored view: rel -> (kind, content
    or target, mode)."""
    files = {
        "bin/run.sh": (b"#!/bin/sh\necho hi\n", 0o755),
        "notes.txt": (b"notes", 0o640),
        ".ssh/id": (b"key", 0o600),
        "setuid.bin": (b"s", 0o4755),  # kept as 0755: never setuid
        "venv/bin/python3": (b"ELF", 0o755),
        "venv/lib/python3.11/site-packages/mod.py": (b"x = 1\n", 0o644),
    }
    links = {
        "latest": "notes.txt",  # relative
        "gone": "nowhere/missing",  # dangling
        "passwd": "/etc/passwd",  # absolute, outside the volume
        "up": "../../",  # out of the volume, a directory
        "victim": str(victim),  # a file the sync must never read
        "venv/bin/python": "python3",
        "venv/lib64": "lib",  # a link to a directory: a link, its content not read again
    }
    expected: dict[str, tuple[str, object, int]] = {}
    for rel, (data, mode) in files.items():
        (vol / rel).parent.mkdir(parents=True, exist_ok=True)
        (vol / rel).write_bytes(data)
        os.chmod(vol / rel, mode)
        expected[rel] = ("file", data, mode & 0o777)
    for rel, target in links.items():
        (vol / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, vol / rel)
        expected[rel] = ("link", target, 0)
    return expected


def view(vol: Path) -> dict[str, tuple[str, object, int]]:
    """What is under ``vol`` (the engine's files left out), never following a link."""
    out: dict[str, tuple[str, object, int]] = {}
    for dirpath, dirnames, filenames in os.walk(vol):  # os.walk follows no link by default
        for name in filenames + dirnames:
            path = Path(dirpath, name)
            rel = path.relative_to(vol).as_posix()
            if name.startswith(".gpulab-sync"):
                continue
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path), 0)
            elif path.is_file():
                out[rel] = ("file", path.read_bytes(), path.stat().st_mode & 0o7777)
    return out


def home_remote(kind: str, tmp_path: Path, s3_server):
    if kind == "fs":
        return FilesystemRemote(tmp_path / "store", "bkt")
    from gpulab.datasync import Credentials, S3Remote

    from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY

    return S3Remote(
        f"home-{os.urandom(6).hex()}",
        endpoint_url=s3_server.endpoint,
        credentials=Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY),
        store_name="test",
    )


@pytest.fixture(params=["fs", "s3"])
def kept(request, tmp_path):
    """A remote of each backend (moto's server started only for the S3 one)."""
    server = request.getfixturevalue("s3") if request.param == "s3" else None
    return home_remote(request.param, tmp_path, server)


def bodies(remote, prefix: str) -> dict[str, bytes]:
    """Every stored object's content, read from the store itself."""
    if isinstance(remote, FilesystemRemote):
        top = remote.data
        found = {p.relative_to(top).as_posix(): p for p in top.rglob("*")}
        assert not any(p.is_symlink() for p in found.values()), "the store holds a link"
        return {k: p.read_bytes() for k, p in found.items() if p.is_file()}
    out = {}
    for obj in remote.list(prefix):
        out[obj.key] = remote.client.get_object(Bucket=remote.bucket, Key=obj.key)["Body"].read()
    return out


def test_a_home_round_trip_keeps_modes_and_links_and_reads_nothing_through_them(
    tmp_path, victim, kept
):
    """Pushed, the volume lost, pulled into a fresh one: the same files with their modes
    (never setuid), the same links (relative, dangling, absolute, out of the volume, to a
    directory), none of them ever followed: no object holds what a link points to."""
    vol = tmp_path / "vol"
    expected = home_tree(vol, victim)
    expected["setuid.bin"] = ("file", b"s", 0o755)
    report = push(vol, kept, "h", "rwd", links=True)
    assert report.ok and report.completed == len(expected), reasons(report)
    stored_now = bodies(kept, "h/")
    assert set(stored_now) == {f"h/{rel}" for rel in expected}  # nothing below a linked dir
    assert stored_now["h/venv/bin/python"] == b"python3" and stored_now["h/up"] == b"../../"
    passwd = Path("/etc/passwd").read_bytes()
    assert SECRET not in stored_now.values() and passwd not in stored_now.values()
    if not isinstance(kept, FilesystemRemote):
        head = kept.client.head_object(Bucket=kept.bucket, Key="h/bin/run.sh")["Metadata"]
        assert head["gpulab-mode"] == "755"
        head = kept.client.head_object(Bucket=kept.bucket, Key="h/latest")["Metadata"]
        assert head["gpulab-type"] == "symlink"

    import shutil

    shutil.rmtree(vol)  # the local volume is lost
    fresh = tmp_path / "fresh"
    pulled = pull(kept, fresh, "h", links=True)
    assert pulled.ok and pulled.completed == len(expected), reasons(pulled)
    assert view(fresh) == expected
    assert victim.read_bytes() == SECRET
    # the next push reads nothing through the restored links and sends nothing
    again = push(fresh, kept, "h", "rwd", links=True)
    assert again.ok and (again.completed, again.skipped) == (0, len(expected)), reasons(again)
    assert bodies(kept, "h/") == stored_now

    # a mode change and a retargeted link are pushed incrementally, the rest is not
    os.chmod(fresh / "bin/run.sh", 0o644)
    os.symlink("bin/run.sh", fresh / ".gpulab-sync-new")
    os.replace(fresh / ".gpulab-sync-new", fresh / "latest")
    inc = push(fresh, kept, "h", "rwd", links=True)
    assert inc.ok and inc.completed == 2, reasons(inc)
    assert bodies(kept, "h/")["h/latest"] == b"bin/run.sh"
    # an older copy notices the retargeted link; a fresh one gets both
    other = tmp_path / "other"
    assert pull(kept, other, "h", links=True).ok
    assert os.readlink(other / "latest") == "bin/run.sh"
    assert (other / "bin/run.sh").stat().st_mode & 0o777 == 0o644


def test_a_kept_link_is_replaced_never_written_through_and_unsynced_ones_stay(tmp_path, victim):
    """Where a pull must put a file and a link stands: the link last synced is replaced (the
    link, not what it points to); one the sync never saw is a conflict, kept; a linked
    directory on the way is still in the way, links kept or not."""
    store = FilesystemRemote(tmp_path / "store", "bkt")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(victim, src / "x")
    assert push(src, store, "p", "rwd", links=True).ok
    vol = tmp_path / "vol"
    assert pull(store, vol, "p", links=True).ok
    assert os.readlink(vol / "x") == str(victim)
    # elsewhere x becomes a file, and y a new file, d/f one below a directory
    (src / "x").unlink()
    tree(src, {"x": b"attacker's content", "y": b"y", "d/f": b"f"})
    assert push(src, store, "p", "rwd", links=True).ok
    os.symlink(victim, vol / "y")  # a link the sync never synced
    (vol / "d").symlink_to(victim.parent, target_is_directory=True)
    report = pull(store, vol, "p", links=True)
    assert (report.completed, report.failed) == (1, 2), reasons(report)
    assert "y: a local symbolic link not synced as it is; kept it" in reasons(report)
    assert "d: something other than a directory is in the way" in reasons(report)
    assert not (vol / "x").is_symlink() and (vol / "x").read_bytes() == b"attacker's content"
    assert (vol / "y").is_symlink() and (vol / "d").is_symlink()
    assert victim.read_bytes() == SECRET
    assert sorted(p.name for p in victim.parent.iterdir()) == ["train.py"]


def test_link_objects_and_modes_from_the_store_are_checked(tmp_path):
    """The store's objects are the user's too (their own prefix): a link object with a NUL
    byte or too long a target is refused; setuid and unreadable modes are not restored; a
    volume that keeps no links restores no link (a note, not in the manifest)."""
    store = FilesystemRemote(tmp_path / "store", "bkt")
    src = tmp_path / "src"
    tree(src, {"a": b"a", "b": b"b", "nul": b"n", "long": b"l", "ok": b"o"})
    os.chmod(src / "a", 0o755)
    assert push(src, store, "p", "rwd").ok

    def meta(key: str, **fields) -> None:
        path = store.meta / f"p/{key}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    meta("a", mode=0o4777)
    meta("b", mode=0)
    for key, body in [("nul", b"x\0y"), ("long", b"x" * 5000), ("ok", b"/etc/passwd")]:
        (store.data / f"p/{key}").write_bytes(body)
        meta(key, size=len(body), sha256=hashlib.sha256(body).hexdigest(), type="symlink")
    vol = tmp_path / "vol"
    report = pull(store, vol, "p", links=True)
    assert (report.completed, report.failed) == (3, 2), reasons(report)
    assert "p/nul: nul: a symbolic link target with a NUL byte" in reasons(report)
    assert "a symbolic link target of 5000 bytes, more than 4096" in reasons(report)
    assert (vol / "a").stat().st_mode & 0o7777 == 0o777
    assert (vol / "b").stat().st_mode & 0o7777 == 0o400
    assert os.readlink(vol / "ok") == "/etc/passwd"
    assert not (vol / "nul").exists() and not (vol / "long").exists()
    assert not list(vol.glob(".gpulab-sync-tmp-*"))
    plain = tmp_path / "plain"
    report = pull(store, plain, "p")
    assert report.ok and report.completed == 2, reasons(report)
    assert any("p/ok: a symbolic link; this volume keeps none" in n for n in report.notes)
    assert not (plain / "ok").exists() and not (plain / "ok").is_symlink()
    assert "p/ok" not in json.loads((plain / MANIFEST_NAME).read_text())["objects"]


def test_the_cli_keeps_links_with_links(tmp_path):
    from gpulab.datasync.cli import main as sync_main

    vol = tmp_path / "vol"
    tree(vol, {"f": b"f"})
    os.symlink("f", vol / "l")
    endpoint = f"file://{tmp_path / 'store'}"
    args = ["push", "--bucket", "bkt", "--prefix", "p", "--local", str(vol), "--mode", "rwd"]
    assert sync_main([*args, "--store-endpoint", endpoint]) == 0
    assert stored(tmp_path / "store") == {"p/f": b"f"}
    assert sync_main([*args, "--store-endpoint", endpoint, "--links"]) == 0
    assert stored(tmp_path / "store") == {"p/f": b"f", "p/l": b"f"}
