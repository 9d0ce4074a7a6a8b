"""The GPU ledger on a real SQLite file, with concurrent reservations from several threads."""

from __future__ import annotations

import concurrent.futures
from datetime import timedelta

import pytest

from gpulab.db import Database, GpuAllocation
from gpulab.gpus.inventory import GpuDevice, from_config
from gpulab.gpus.ledger import GpuLedger, NoGpuAvailable, holders
from gpulab.lifecycle import utcnow


@pytest.fixture
def ledger(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    return GpuLedger(db, "test", [GpuDevice(str(i)) for i in range(4)])


def test_concurrent_reservations_never_share_a_device(ledger, tmp_path):
    # a second Database object on the same file stands for another process
    other = GpuLedger(Database(f"sqlite:///{tmp_path / 'ledger.sqlite'}"), "test", ledger.devices)

    def take(i):
        led = ledger if i % 2 else other
        try:
            return led.reserve(f"w{i}", "u", "notebook", 1)
        except NoGpuAvailable as e:
            return str(e)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(take, range(8)))
    granted = [r[0] for r in results if isinstance(r, list)]
    refused = [r for r in results if isinstance(r, str)]
    assert sorted(granted) == ["0", "1", "2", "3"]
    assert len(refused) == 4 and all("4 of 4 in use, 0 free" in r for r in refused)


def test_reserve_is_idempotent_and_release_frees(ledger):
    assert ledger.reserve("a", "u", "notebook", 2) == ["0", "1"]
    assert ledger.reserve("a", "u", "notebook", 2) == ["0", "1"]
    assert ledger.free_count() == 2
    assert sorted(ledger.release("a")) == ["0", "1"]
    assert ledger.release("a") == []
    assert ledger.free_count() == 4


def test_more_than_the_host_has(ledger):
    with pytest.raises(NoGpuAvailable, match="5 GPUs requested but this host has 4"):
        ledger.reserve("a", "u", "notebook", 5)


def test_reconcile_releases_vanished_workloads_only(ledger):
    ledger.reserve("alive", "u", "notebook", 1)
    ledger.reserve("gone", "u", "notebook", 1)
    ledger.reserve("job", "u", "job", 1)
    # young reservations are left alone (their container may not exist yet)
    assert ledger.reconcile(["alive"], "notebook") == []
    with ledger.db.session() as s:
        for a in s.query(GpuAllocation):
            a.since = utcnow() - timedelta(minutes=5)
    assert ledger.reconcile(["alive"], "notebook") == ["gone"]
    assert {a["workload"] for a in ledger.allocations()} == {"alive", "job"}


def test_inventory_rejects_duplicates():
    with pytest.raises(ValueError, match="twice"):
        from_config([{"id": "0"}, {"id": "0"}])


def test_holders_group_a_devices_rows_by_workload_with_the_fraction_they_make():
    since = "2026-01-01T00:00:00Z"

    def row(share, workload, owner="u"):
        return {"device": "1", "share": share, "workload": workload, "kind": "notebook",
                "owner": owner, "since": since, "gpus": 0.25}  # fmt: skip

    held = holders([row(3, "b"), row(2, "a"), row(1, "a")], 4)
    assert [(h["workload"], h["slots"], h["fraction"]) for h in held] == [
        ("a", [1, 2], 0.5),
        ("b", [3], 0.25),
    ]
    assert held[0]["owner"] == "u" and held[0]["since"] == since
    # a whole device: no slot, no fraction; a device whose slot count is unknown: its slots
    whole = holders([{**row(0, "w"), "gpus": 1.0}], 0)
    assert [(h["slots"], h["fraction"]) for h in whole] == [([], None)]
    assert holders([row(1, "a"), row(2, "a")], 0)[0]["fraction"] == 2.0
    assert holders([row(1, "a"), row(2, "a"), row(3, "a")], 3)[0]["fraction"] == 1.0
    assert holders([row(1, "a")], 3)[0]["fraction"] == 0.3333


def test_holdings_list_every_device_then_the_rows_of_devices_no_longer_configured(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    devices = [GpuDevice(str(i), "Test GPU", "16G") for i in range(3)]
    ledger = GpuLedger(db, "test", devices, sharing={"1": 4})
    ledger.reserve("job-a", "ann", "job", 1)
    ledger.reserve("nb-b", "bob", "notebook", 0.5)
    ledger.reserve("nb-c", "cy", "notebook", 0.25)
    with db.session() as s:
        s.add(GpuAllocation(instance="test", device="9", workload="gone", kind="job", owner="d"))
    got = ledger.holdings(ledger.allocations())
    assert [(g["device"]["id"], g["key"], g["slots"], g["used"]) for g in got] == [
        ("0", "0", 0, 0),
        ("1", "1", 4, 3),
        ("2", "2", 0, 0),
        ("9", None, 0, 0),
    ]
    assert got[0]["device"] == {"id": "0", "model": "Test GPU", "memory": "16G"}
    assert [(h["workload"], h["slots"], h["fraction"]) for h in got[0]["held"]] == [
        ("job-a", [], None)
    ]
    assert [(h["workload"], h["slots"], h["fraction"]) for h in got[1]["held"]] == [
        ("nb-b", [1, 2], 0.5),
        ("nb-c", [3], 0.25),
    ]
    assert got[2]["held"] == []
    assert got[3]["device"] == {"id": "9", "model": "(not configured)", "memory": ""}
    assert [h["workload"] for h in got[3]["held"]] == ["gone"]
