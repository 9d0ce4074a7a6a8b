"""The GPU ledger on a real SQLite file, with concurrent reservations from several threads."""

from __future__ import annotations

import concurrent.futures
from datetime import timedelta

import pytest

from gpulab.db import Database, GpuAllocation
from gpulab.gpus.inventory import GpuDevice, from_config
from gpulab.gpus.ledger import GpuLedger, NoGpuAvailable
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
