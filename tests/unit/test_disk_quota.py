"""The per-user disk quota: its rules as data, its settings, the ledger on a real SQLite file
(with concurrent bookings from several threads and two Database objects, as the hub and the
service are two processes), the sync engine's ``--max-bytes`` on the filesystem store, and what
the helpers are told."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
from traitlets import TraitError

from gpulab.data.helper import sync_helper_spec
from gpulab.data.sync import VolumeSync, WorkloadData
from gpulab.datasync.cli import main as sync_main
from gpulab.datasync.engine import pull
from gpulab.datasync.filesystem import FilesystemRemote
from gpulab.db import Database
from gpulab.disk_ledger import DiskLedger, DiskQuotaExceeded
from gpulab.disk_quota import (
    GiB,
    KiB,
    MiB,
    check_booking,
    clone_over,
    clone_refusal,
    disk_quota_for,
    human,
    parse_size,
    pull_refusal,
)
from gpulab.jobs.spec import GitSource
from gpulab.jobs.supervisor.git_sources import clone_helper_spec
from gpulab.settings import GpulabSettings
from gpulab.volumes import ObjectStore, parse_volume

# --- the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "user, groups, want",
    [
        ("own", ["big"], 1 * MiB),  # the user's own quota wins, even over a bigger group's
        ("free", [], None),  # an own None: unlimited
        ("member", ["small", "big"], 8 * MiB),  # the most generous group
        ("member", ["small", "open"], None),  # unlimited beats every size
        ("member", ["small"], 2 * MiB),
        ("nobody", ["other"], 4 * MiB),  # the default
    ],
)
def test_quota_own_else_most_generous_group_else_default(user, groups, want):
    per_user = {"own": 1 * MiB, "free": None}
    per_group = {"small": 2 * MiB, "big": 8 * MiB, "open": None}
    assert disk_quota_for(user, groups, 4 * MiB, per_user, per_group) == want


@pytest.mark.parametrize(
    "want, held, quota, up_to, allowed, granted, left",
    [
        (3, 0, 10, False, True, 3, 10),
        (10, 0, 10, False, True, 10, 10),  # exactly the quota fits
        (11, 0, 10, False, False, 0, 10),
        (4, 7, 10, False, False, 0, 3),
        (4, 12, 10, False, False, 0, 0),  # over already (a quota lowered): nothing left
        (4, 7, None, False, True, 4, None),  # unlimited
        (0, 10, 10, False, True, 0, 0),  # an empty volume always fits
        (20, 7, 10, True, True, 3, 3),  # a clone gets what is left
        (20, 10, 10, True, False, 0, 0),  # ... unless nothing is
    ],
)
def test_check_booking(want, held, quota, up_to, allowed, granted, left):
    c = check_booking(want, held, quota, up_to=up_to)
    assert (c.allowed, c.granted, c.held, c.left) == (allowed, granted, held, left)


def test_sizes_and_messages():
    assert parse_size("200G", "disk_quota") == 200 * GiB
    assert parse_size("512K", "q") == 512 * KiB and parse_size(1000, "q") == 1000
    assert parse_size(None, "q") is None
    for bad in ("lots", "-1", 0, "1e9", True):
        with pytest.raises(ValueError, match="q"):
            parse_size(bad, "q")
    assert [human(n) for n in (0, 512, 3 * KiB, 3 * MiB // 2, 200 * GiB)] == [
        "0 B",
        "512 B",
        "3.0 KiB",
        "1.5 MiB",
        "200.0 GiB",
    ]
    m = pull_refusal("data@s3/big:/data", 3 * MiB, 4 * MiB, 5 * MiB // 2)
    assert m.startswith("volume data@s3/big:/data was not pulled: it holds 3.0 MiB, ")
    assert "more than the 1.5 MiB left of your disk quota of 4.0 MiB" in m
    assert "hold 2.5 MiB" in m
    m = clone_refusal("http://h/r.git (branch main)", 4 * MiB, 4 * MiB)
    assert m.startswith("clone of http://h/r.git (branch main) was not started: ")
    assert "disk quota of 4.0 MiB is used up" in m
    m = clone_over("http://h/r.git (branch main)", MiB, 4 * MiB, 3 * MiB)
    assert "larger than the 1.0 MiB left of your disk quota of 4.0 MiB" in m


def test_settings_default_and_resolution():
    s = GpulabSettings()
    assert s.disk_quota_for("anyone", []) == 200 * GiB
    assert s.git_max_bytes_value == 10 * GiB
    s = GpulabSettings(
        disk_quota="1M",
        user_disk_quotas={"ann": "64K", "root": None},
        group_disk_quotas={"ml": "8M"},
        git_max_bytes=4096,
    )
    assert s.disk_quota_for("ann", ["ml"]) == 64 * KiB
    assert s.disk_quota_for("root", []) is None
    assert s.disk_quota_for("bob", ["ml"]) == 8 * MiB
    assert s.disk_quota_for("bob", []) == MiB
    assert s.git_max_bytes_value == 4096


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"disk_quota": "huge"}, "c.GpulabSettings.disk_quota"),
        ({"git_max_bytes": None}, "'git_max_bytes' trait"),
        ({"git_max_bytes": "0"}, "git_max_bytes"),
        ({"user_disk_quotas": {"ann": "-5G"}}, "user_disk_quotas['ann']"),
        ({"group_disk_quotas": {"ml": [1]}}, "group_disk_quotas['ml']"),
    ],
)
def test_bad_settings_are_refused_naming_them(kwargs, words):
    with pytest.raises(TraitError) as e:
        GpulabSettings(**kwargs)
    assert words in str(e.value)


# --- the ledger -----------------------------------------------------------------------------


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'disk.sqlite'}"


def test_book_replace_settle_release(db_url):
    led = DiskLedger(Database(db_url), "t")
    led.book("ann", "w1", "vol-a", "", 3 * MiB, 10 * MiB)
    # a pull again of the same volume (a notebook started again) replaces its booking
    led.book("ann", "w1", "vol-a", "", 4 * MiB, 10 * MiB)
    assert led.held("ann") == 4 * MiB
    # the same volume name on another node is another copy, on another disk
    led.book("ann", "w1", "vol-a", "node-2", 4 * MiB, 10 * MiB)
    assert led.held("ann") == 8 * MiB
    with pytest.raises(DiskQuotaExceeded) as e:
        led.book("ann", "w2", "vol-b", "", 3 * MiB, 10 * MiB)
    assert (e.value.check.held, e.value.check.left, e.value.quota) == (8 * MiB, 2 * MiB, 10 * MiB)
    assert led.held("ann") == 8 * MiB  # a refusal books nothing
    # a clone books what is left, then what it really took
    c = led.book("ann", "w2", "git-0", "", 20 * GiB, 10 * MiB, kind="git", up_to=True)
    assert c.granted == 2 * MiB and led.held("ann") == 10 * MiB
    led.settle("git-0", "", MiB // 2)
    assert led.held("ann") == 8 * MiB + MiB // 2
    led.settle("git-0", "", 5 * GiB)  # never more than it had booked
    assert led.held("ann") == 8 * MiB + MiB // 2
    # other users and other instances are not counted
    led.book("bob", "w3", "vol-c", "", 10 * MiB, 10 * MiB)
    DiskLedger(Database(db_url), "other").book("ann", "w9", "vol-a", "", 10 * MiB, 10 * MiB)
    assert led.held("ann") == 8 * MiB + MiB // 2
    led.release("vol-a", "node-2")
    assert led.held("ann") == 4 * MiB + MiB // 2
    assert led.release_workload("w2") == 1 and led.held("ann") == 4 * MiB
    # after a restart: bookings of workloads whose volumes are gone go
    assert led.release_all_but({"w3"}, "w") == ["w1"]
    assert led.held("ann") == 0 and led.held("bob") == 10 * MiB
    assert [b["volume"] for b in led.bookings()] == ["vol-c"]


def test_concurrent_bookings_never_overshoot_the_quota(db_url):
    """Eight workloads of one user start at once, through two processes' databases: each
    needs 3 MiB of a 10 MiB quota, so exactly three get their bytes."""
    leds = [DiskLedger(Database(db_url), "t"), DiskLedger(Database(db_url), "t")]

    def take(i: int):
        try:
            return leds[i % 2].book("ann", f"w{i}", f"vol-{i}", "", 3 * MiB, 10 * MiB).granted
        except DiskQuotaExceeded as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(take, range(8)))
    granted = [r for r in results if isinstance(r, int)]
    assert granted == [3 * MiB] * 3
    assert leds[0].held("ann") == 9 * MiB


# --- the sync engine's cap and what the helpers are told -----------------------------------


def _fill(root, bucket: str, files: dict[str, bytes]) -> None:
    for key, body in files.items():
        path = root / bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


def test_pull_over_max_bytes_fetches_nothing(tmp_path):
    store = tmp_path / "store"
    _fill(store, "b", {"big/a.bin": b"a" * 3000, "big/b.bin": b"b" * 2000, "other/c": b"c" * 9})
    remote = FilesystemRemote(store, "b")
    local = tmp_path / "local"
    report = pull(remote, local, "big", max_bytes=4999)
    assert not report.ok and report.completed == 0 and report.bytes_transferred == 0
    assert "b/big/ holds 4.9 KiB in 2 objects, more than the 4.9 KiB booked" in (
        report.failures[0].reason
    )
    assert sorted(p.name for p in local.rglob("*") if p.is_file() and "bin" in p.name) == []
    report = pull(remote, local, "big", max_bytes=5000)  # exactly what is there: pulled
    assert report.ok and report.completed == 2 and report.bytes_transferred == 5000


def test_sync_command_max_bytes(tmp_path, capsys):
    store = tmp_path / "store"
    _fill(store, "bkt", {"p/x": b"x" * 100})
    args = ["pull", "--bucket", "bkt", "--prefix", "p", "--local", str(tmp_path / "l")]
    args += ["--store-endpoint", f"file://{store}", "--json-progress"]
    assert sync_main([*args, "--max-bytes", "99"]) == 1
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["failed"] == 1 and "(--max-bytes)" in report["failures"][0]["reason"]
    assert sync_main([*args, "--max-bytes", "-1"]) == 2
    assert sync_main([*args, "--max-bytes", "100"]) == 0


def test_helpers_are_told_their_booking():
    def config(op, **kw):
        return sync_helper_spec(
            image="i",
            operation=op,
            bucket="b",
            prefix="p",
            mode="rw",
            docker_volume=None if op == "purge" else "v",
            store_kind="s3",
            store_root=None,
            endpoint_url="http://s3",
            region="r",
            labels={},
            environment={},
            **kw,
        ).command

    cmd = config("pull", max_bytes=1234)
    assert cmd[cmd.index("--max-bytes") + 1] == "1234"
    assert "--max-bytes" not in config("pull")
    assert "--max-bytes" not in config("push", max_bytes=1234)
    src = GitSource("https://h/r.git", "/w/r", branch="main")
    cmd = clone_helper_spec(
        image="i", source=src, volume="v", labels={}, files={}, max_bytes=77, quota_bytes=55
    ).command
    assert "--max-bytes=77" in cmd and "--quota-bytes=55" in cmd
    cmd = clone_helper_spec(image="i", source=src, volume="v", labels={}, files={})
    assert not any(a.startswith("--quota-bytes") for a in cmd.command)


def test_listed_size_is_what_the_pull_brings(tmp_path):
    root = tmp_path / "store"
    _fill(root, "data", {"set/a": b"a" * 700, "set/sub/b": b"b" * 300, "settle/c": b"c" * 50})
    stores = {"fs": ObjectStore("fs", kind="filesystem", root=str(root))}
    data = WorkloadData(None, stores, "img", "t", "w")  # type: ignore[arg-type]

    def vol(spec: str) -> VolumeSync:
        return VolumeSync(parse_volume(spec, stores), "v", spec)

    # the prefix is a directory: "set" does not take "settle"'s objects
    assert data.listed_size(vol("data@fs/set:/d")) == 1000
    assert data.listed_size(vol("data@fs:/d")) == 1050
    assert data.listed_size(vol("nothing@fs/x:/d")) == 0
