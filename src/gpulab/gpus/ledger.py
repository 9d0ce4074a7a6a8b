"""The GPU ledger: which workload holds which device, shared by every gpulab process.

A device is handed out by inserting a row under a uniqueness constraint on (device, share), so
two processes can never both hold it. The ledger survives restarts and is reconciled with the
engine's labelled containers at start-up.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from ..db import Database, GpuAllocation, Job
from ..jobs.gang import choose_gang, gang_fits, regroup
from ..lifecycle import utcnow
from .inventory import GpuDevice

log = logging.getLogger(__name__)
RESERVE_ATTEMPTS = 50


class NoGpuAvailable(RuntimeError):
    def __init__(self, asked: int, total: int, in_use: int, biggest: tuple[str, int] | None = None):
        self.asked, self.total, self.in_use = asked, total, in_use
        free = total - in_use
        if biggest is not None and asked > biggest[1]:
            msg = too_big_message(asked, *biggest)
        elif biggest is not None:
            msg = (
                f"no node has {asked} GPUs free at once: {in_use} of {total} in use across the "
                "cluster; a workload runs on one node: try again later or ask for fewer"
            )
        elif asked > total:
            msg = f"{asked} GPUs requested but this host has {total}"
        else:
            msg = (
                f"no GPU free for this request: {asked} requested, "
                f"{in_use} of {total} in use, {free} free; try again later or ask for fewer"
            )
        super().__init__(msg)


def too_big_message(asked: int, node: str, gpus: int) -> str:
    """A request that fits no single node: say what the biggest one offers."""
    return (
        f"{asked} GPUs requested but a workload runs on one node and the biggest node "
        f"({node}) has {gpus}: ask for {gpus} or fewer"
    )


class GpuQuotaExceeded(NoGpuAvailable):
    """The owner's GPUs (notebooks and in-quota jobs together) would exceed their quota."""

    def __init__(self, asked: int, held: int, quota: int):
        self.asked, self.held, self.quota = asked, held, quota
        RuntimeError.__init__(
            self,
            f"{asked} GPU(s) requested but you already hold {held} of your quota of {quota} "
            "(notebooks and jobs together): stop a notebook or wait for a job to end",
        )


class GpuLedger:
    def __init__(
        self,
        db: Database,
        instance: str,
        devices: Sequence[GpuDevice],
        policy: str = "pack",
        nodes: Sequence[str] | None = None,
    ):
        self.db = db
        self.instance = instance
        self.devices = list(devices)
        self.policy = policy
        #: the cluster's nodes that take workloads (None: one host, no node to choose)
        self.nodes: list[str] | None = list(nodes) if nodes is not None else None

    @property
    def clustered(self) -> bool:
        return self.nodes is not None

    def biggest_node(self) -> tuple[str, int]:
        """(node, GPUs) of the node with the most GPUs ("this host" on one host)."""
        if not self.clustered:
            return "this host", len(self.devices)
        counts = {n: 0 for n in self.nodes or []}
        for d in self.devices:
            counts[d.node] = counts.get(d.node, 0) + 1
        if not counts:
            return "none", 0
        return max(counts.items(), key=lambda kv: (kv[1], kv[0]))

    def gpu_home(self) -> tuple[int, str]:
        """(the most GPUs one workload can have, what has them): for refusal messages."""
        node, gpus = self.biggest_node()
        if not self.clustered:
            return gpus, "this host"
        return gpus, f"a workload runs on one node and the biggest ({node})"

    def choose(self, free: Sequence[GpuDevice], count: int) -> list[GpuDevice]:
        """Pick ``count`` of the ``free`` devices, all on one node, by the placement policy.
        Empty when no node has enough (one host: the first free ones)."""
        if not self.clustered:
            return list(free[:count]) if len(free) >= count else []
        by_node: dict[str, list[GpuDevice]] = {}
        for d in free:
            by_node.setdefault(d.node, []).append(d)
        fits = [(n, ds) for n, ds in by_node.items() if len(ds) >= count]
        if not fits:
            return []
        if self.policy == "spread":
            node, ds = max(fits, key=lambda f: (len(f[1]), f[0]))
        else:  # pack: the fullest node that still fits keeps whole nodes free for big work
            node, ds = min(fits, key=lambda f: (len(f[1]), f[0]))
        return ds[:count]

    def node_for_cpu(self) -> str:
        """The node for a workload without GPUs: where GPUs are fewest free (pack; keeps the
        free GPUs' nodes for GPU work) or most free (spread)."""
        if not self.clustered:
            return ""
        if not self.nodes:
            raise NoGpuAvailable(0, 0, 0, ("none", 0))
        with self.db.read() as s:
            busy = set(
                s.scalars(
                    select(GpuAllocation.device).where(GpuAllocation.instance == self.instance)
                )
            )
        free = {n: 0 for n in self.nodes}
        for d in self.devices:
            if d.key not in busy and d.node in free:
                free[d.node] += 1
        pick = max if self.policy == "spread" else min
        return pick(sorted(free), key=lambda n: free[n])

    def reserve(
        self, workload: str, owner: str, kind: str, count: int, quota: int | None = None
    ) -> list[str]:
        """Give ``count`` free devices to ``workload`` (the ones it holds if it has some).

        ``quota``: the most GPUs ``owner`` may hold in quota, notebooks and jobs together
        (None: no limit). GPUs lent to the owner's over-quota (preemptible) jobs do not count.
        The count and the insert are one transaction, serialized per owner, so that two
        reservations at once cannot overshoot it (GpuQuotaExceeded).
        """
        if count <= 0:
            return []
        ranks = self._reserve(
            workload,
            owner,
            kind,
            count,
            quota,
            lambda free: [[d.key for d in self.choose(free, count)]],
        )
        return sorted(ranks[0]) if len(ranks) == 1 else sorted(sum(ranks, []))

    def reserve_gang(
        self,
        workload: str,
        owner: str,
        kind: str,
        per_worker: int,
        workers: int,
        quota: int | None = None,
    ) -> list[list[str]]:
        """Book ``workers`` ranks of ``per_worker`` devices each for ``workload``, every
        rank's on one node, all in one transaction or none (a distributed job). Returns each
        rank's devices (what it holds already, regrouped, if it holds some)."""
        if per_worker <= 0:
            return [[] for _ in range(workers)]

        def pick(free: Sequence[GpuDevice]) -> list[list[str]]:
            by_node: dict[str, list[str]] = {}
            for d in free:
                by_node.setdefault(d.node, []).append(d.key)
            return choose_gang(by_node, per_worker, workers, spread=self.policy == "spread")

        return self._reserve(workload, owner, kind, per_worker * workers, quota, pick, workers)

    def gang_slots(self) -> dict[int, int]:
        """Workers of g GPUs (g from 1 to the biggest node's) the nodes hold at once."""
        capacity: dict[str, int] = {}
        for d in self.devices:
            capacity[d.node] = capacity.get(d.node, 0) + 1
        most = max(capacity.values(), default=0)
        return {g: sum(c // g for c in capacity.values()) for g in range(1, most + 1)}

    def gang_refusal(self, per_worker: int, workers: int) -> str | None:
        """Why ``workers`` ranks of ``per_worker`` GPUs can never be placed (all nodes
        empty), or None: checked at submission."""
        if workers <= 1 or per_worker <= 0:
            return None
        capacity: dict[str, int] = {}
        for d in self.devices:
            capacity[d.node] = capacity.get(d.node, 0) + 1
        if gang_fits(capacity, per_worker, workers):
            return None
        slots = sum(c // per_worker for c in capacity.values())
        where = "this host" if not self.clustered else f"the cluster's {len(capacity)} node(s)"
        return (
            f"{workers} workers of {per_worker} GPU(s) each requested but {where} can hold "
            f"at most {slots} such workers at once: ask for fewer workers or fewer GPUs each"
        )

    def _reserve(
        self,
        workload: str,
        owner: str,
        kind: str,
        count: int,
        quota: int | None,
        pick: Callable[[Sequence[GpuDevice]], list[list[str]]],
        workers: int = 1,
    ) -> list[list[str]]:
        for attempt in range(RESERVE_ATTEMPTS):
            try:
                with self.db.session() as s:
                    if quota is not None:
                        self.db.serialize(s, "gpulab-gpus", self.instance, owner)
                    held = s.execute(
                        select(
                            GpuAllocation.device, GpuAllocation.workload, GpuAllocation.owner
                        ).where(GpuAllocation.instance == self.instance)
                    ).all()
                    mine = [d for d, w, _ in held if w == workload]
                    if mine:
                        if workers == 1:
                            return [sorted(mine)]
                        return regroup(mine, count // workers, workers)
                    if quota is not None:
                        lent = self._lent_workloads(s, owner)
                        in_quota = sum(1 for _, w, o in held if o == owner and w not in lent)
                        if in_quota + count > quota:
                            raise GpuQuotaExceeded(count, in_quota, quota)
                    busy = {d for d, _, _ in held}
                    free = [d for d in self.devices if d.key not in busy]
                    chosen = [ds for ds in pick(free) if ds]
                    if not chosen:
                        biggest = self.biggest_node() if self.clustered else None
                        raise NoGpuAvailable(count, len(self.devices), len(busy), biggest)
                    for dev in (d for ds in chosen for d in ds):
                        s.add(
                            GpuAllocation(
                                instance=self.instance,
                                device=dev,
                                share=0,
                                workload=workload,
                                kind=kind,
                                owner=owner,
                            )
                        )
                return chosen
            except IntegrityError:
                # another process took one of them between our read and write (PostgreSQL:
                # the unique constraint decides): look again, after a short random pause
                log.info("GPU reservation for %s raced another; retrying", workload)
                time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
        raise RuntimeError(f"GPU reservation for {workload} kept racing; try again")

    def _lent_workloads(self, s, owner: str) -> set[str]:
        """Workloads of ``owner``'s jobs that run over quota on lent GPUs."""
        from ..runtime.objects import job_workload_id

        ids = s.scalars(
            select(Job.id).where(
                Job.instance == self.instance, Job.owner == owner, Job.over_quota == 1
            )
        )
        return {job_workload_id(self.instance, i) for i in ids}

    def release(self, workload: str) -> list[str]:
        with self.db.session() as s:
            rows = s.scalars(
                select(GpuAllocation.device).where(
                    GpuAllocation.instance == self.instance, GpuAllocation.workload == workload
                )
            ).all()
            s.execute(
                delete(GpuAllocation).where(
                    GpuAllocation.instance == self.instance, GpuAllocation.workload == workload
                )
            )
            return list(rows)

    def held_by(self, workload: str) -> list[str]:
        with self.db.read() as s:
            return sorted(
                s.scalars(
                    select(GpuAllocation.device).where(
                        GpuAllocation.instance == self.instance, GpuAllocation.workload == workload
                    )
                )
            )

    def allocations(self) -> list[dict]:
        with self.db.read() as s:
            rows = s.scalars(
                select(GpuAllocation).where(GpuAllocation.instance == self.instance)
            ).all()
            return [
                {
                    "device": r.device,
                    "share": r.share,
                    "workload": r.workload,
                    "kind": r.kind,
                    "owner": r.owner,
                    "since": r.since.isoformat().replace("+00:00", "Z"),
                }
                for r in rows
            ]

    def free_count(self) -> int:
        with self.db.read() as s:
            busy = set(
                s.scalars(
                    select(GpuAllocation.device).where(GpuAllocation.instance == self.instance)
                )
            )
        return sum(1 for d in self.devices if d.key not in busy)

    def reconcile(self, live_workloads: Iterable[str], kind: str, grace: float = 60.0) -> list[str]:
        """Release what ``kind`` workloads hold that have no container any more.

        Reservations younger than ``grace`` seconds are left alone: their container may not be
        created yet.
        """
        live = set(live_workloads)
        cutoff = utcnow() - timedelta(seconds=grace)
        with self.db.session() as s:
            stale = s.scalars(
                select(GpuAllocation).where(
                    GpuAllocation.instance == self.instance,
                    GpuAllocation.kind == kind,
                    GpuAllocation.since < cutoff,
                )
            ).all()
            gone = [a for a in stale if a.workload not in live]
            for a in gone:
                log.warning("releasing GPU %s held by vanished %s", a.device, a.workload)
                s.delete(a)
            return sorted({a.workload for a in gone})
