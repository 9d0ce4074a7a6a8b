"""The GPU ledger's guarantees, checked on its rows (unit tests and the PostgreSQL tests)."""

from __future__ import annotations

from sqlalchemy import select

from gpulab.db import Database, GpuAllocation


def check_ledger_invariants(db: Database, instance: str, slots: dict[str, int]) -> list[tuple]:
    """The ledger's guarantees, read from its rows: a device is held whole by one workload or
    shared in distinct slots within its slot count, never both; a workload's share is on one
    device. Returns the rows (device, share, workload)."""
    with db.read() as s:
        rows = s.execute(
            select(GpuAllocation.device, GpuAllocation.share, GpuAllocation.workload).where(
                GpuAllocation.instance == instance
            )
        ).all()
    by_device: dict[str, list[tuple[int, str]]] = {}
    for d, sh, w in rows:
        by_device.setdefault(d, []).append((sh, w))
    for d, held in by_device.items():
        shares = [sh for sh, _ in held]
        if 0 in shares:
            assert len(held) == 1, f"device {d} held whole and more: {held}"
        else:
            assert len(set(shares)) == len(shares), f"device {d}: a slot twice: {held}"
            assert all(1 <= sh <= slots[d] for sh in shares), f"device {d}: {held}"
    devices_of: dict[str, set[str]] = {}
    for d, sh, w in rows:
        if sh:
            devices_of.setdefault(w, set()).add(d)
    assert all(len(ds) == 1 for ds in devices_of.values()), devices_of
    return [tuple(r) for r in rows]
