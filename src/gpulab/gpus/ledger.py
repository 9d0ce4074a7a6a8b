"""The GPU ledger: which workload holds which device, shared by every gpulab process.

A device is handed out by inserting a row under a uniqueness constraint on (device, share), so
two processes can never both hold it. A whole device is share 0; a shareable device
(:mod:`gpulab.gpus.sharing`) is booked slot by slot, shares 1..slots. The ledger survives
restarts and is reconciled with the engine's labelled containers at start-up.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from ..db import Database, GpuAllocation, Job
from ..lifecycle import utcnow
from ..names import job_workload_id
from ..resources import beyond_gpus
from . import placement
from .inventory import GpuDevice, described, from_nodes, node_pools_of
from .placement import ANY, Want
from .sharing import is_fraction, pick_shared, share_of, slots_of

log = logging.getLogger(__name__)
RESERVE_ATTEMPTS = 50


class NoGpuAvailable(RuntimeError):
    def __init__(self, asked: int, total: int, in_use: int, biggest: tuple[str, int] | None = None):
        self.asked, self.total, self.in_use = asked, total, in_use
        free = total - in_use
        too_many = beyond_gpus(asked, total)
        if biggest is not None and asked > biggest[1]:
            msg = too_big_message(asked, *biggest)
        elif biggest is not None:
            msg = (
                f"no node has {asked} GPUs free at once: {in_use} of {total} in use across the "
                "cluster; a workload runs on one node: try again later or ask for fewer"
            )
        elif too_many:
            msg = too_many
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


class NoWantedGpu(NoGpuAvailable):
    """Too few devices of the model and pool a request asks for are free now."""

    def __init__(self, asked: int, want: Want, devices: Sequence[GpuDevice], busy: set[str]):
        in_use = sum(1 for d in devices if d.key in busy)
        self.asked, self.total, self.in_use = asked, len(devices), in_use
        RuntimeError.__init__(
            self,
            f"no {asked} GPU(s){want.text()} free at once now: {in_use} of {len(devices)} "
            "such GPUs in use; try again later or ask for fewer",
        )


class NoGpuShareAvailable(NoGpuAvailable):
    """No shareable device has the slots a fractional request needs free now."""

    def __init__(self, fraction: float, free: Mapping[str, tuple[int, int]]):
        self.asked, self.total, self.in_use = fraction, len(free), 0
        if free:
            where = "; ".join(f"GPU {k}: {f} of {s} slots free" for k, (f, s) in free.items())
        else:
            where = "no GPU is shared here"
        RuntimeError.__init__(
            self,
            f"no shared GPU has {fraction:g} of a GPU free now ({where}); try again later, "
            "or ask for a smaller share or a whole GPU",
        )


class GpuQuotaExceeded(NoGpuAvailable):
    """The owner's GPUs (notebooks and in-quota jobs together) would exceed their quota."""

    def __init__(self, asked: float, held: float, quota: int):
        self.asked, self.held, self.quota = asked, held, quota
        RuntimeError.__init__(
            self,
            f"{asked:g} GPU(s) requested but you already hold {held:g} of your quota of {quota} "
            "(notebooks and jobs together): stop a notebook or wait for a job to end",
        )


def holders(rows: list[dict], slots: int) -> list[dict]:
    """One device's ledger rows (:meth:`GpuLedger.allocations`), one entry per workload: the
    workload's first row, with the ``slots`` it holds of a shared device (their numbers, in
    order; none for a whole device) and the ``fraction`` of the GPU they make
    (:func:`~gpulab.gpus.sharing.share_of` of a ``slots``-slot device; None for a whole one)."""
    out: dict[str, dict] = {}
    for a in sorted(rows, key=lambda a: a["share"]):
        entry = out.setdefault(a["workload"], {**a, "slots": []})
        if a["share"]:
            entry["slots"].append(a["share"])
    for entry in out.values():
        n = len(entry["slots"])
        entry["fraction"] = share_of(n, slots) if n else None
    return list(out.values())


class GpuLedger:
    def __init__(
        self,
        db: Database,
        instance: str,
        devices: Sequence[GpuDevice],
        policy: str = "pack",
        nodes: Sequence[str] | None = None,
        sharing: Mapping[str, int] | None = None,
        models: Mapping[str, str] | None = None,
        pools: Sequence[str] = (),
    ):
        self.db = db
        self.instance = instance
        #: the admin's names of the GPUs' models (gpu_models: ledger key -> model)
        self.models: dict[str, str] = dict(models or {})
        self.devices = described(devices, self.models, pools)
        #: each node's pools (node -> names): one host's are ``node_pools``
        self.node_pools: dict[str, tuple[str, ...]] = (
            {"": tuple(pools)} if nodes is None else {n: () for n in nodes}
        )
        self.policy = policy
        #: the cluster's nodes that take workloads (None: one host, no node to choose)
        self.nodes: list[str] | None = list(nodes) if nodes is not None else None
        #: shareable devices and their slots, as configured (GpulabSettings.gpu_sharing)
        self.sharing: dict[str, int] = dict(sharing or {})

    @classmethod
    def for_runtime(cls, db: Database, settings, runtime) -> GpuLedger:
        """The ledger of the GPUs ``runtime`` (a :class:`gpulab.runtime.Runtime`) places
        workloads on, with ``settings``' placement policy and shared devices. One engine: its
        devices, fixed (configured or NVML, read when the runtime was made). Devices across
        several nodes (``runtime.clustered``): none until :meth:`refresh` reads the nodes."""
        return cls(
            db,
            settings.instance,
            [] if runtime.clustered else runtime.devices,
            settings.placement,
            [] if runtime.clustered else None,
            sharing=settings.gpu_sharing,
            models=settings.gpu_models,
            pools=() if runtime.clustered else settings.node_pools,
        )

    async def refresh(self, runtime) -> bool:
        """A cluster's nodes that take workloads now and their devices, as ``runtime.nodes()``
        reports them (one host's devices are fixed: nothing to read). Whether they changed;
        raises what ``nodes()`` raises (gpulab's EngineError)."""
        if not self.clustered:
            return False
        found = await runtime.nodes()
        devices, nodes = from_nodes(found)
        devices = described(devices, self.models)
        pools = node_pools_of(found)
        changed = nodes != self.nodes or devices != self.devices or pools != self.node_pools
        self.devices, self.nodes, self.node_pools = devices, nodes, pools
        return changed

    def slots(self, device: GpuDevice) -> int:
        """How many slots ``device`` is shared in (0: whole devices only)."""
        return slots_of(self.sharing, device) if self.sharing else 0

    def slot_counts(self) -> dict[str, int]:
        """{device key: slots} of the shareable devices."""
        return {d.key: n for d in self.devices if (n := self.slots(d))}

    @property
    def clustered(self) -> bool:
        return self.nodes is not None

    def biggest_node(self) -> tuple[str, int]:
        """(node, GPUs) of the node with the most GPUs ("this host" on one host)."""
        if not self.clustered:
            return "this host", len(self.devices)
        return placement.biggest_node(self.devices, self.nodes or [])

    def could_fit(self, count: float, want: Want = ANY) -> bool:
        """Whether ``count`` GPUs (of the model and pool ``want`` asks for) would fit when
        every device is free: whole GPUs on the biggest node that takes workloads now, a share
        on a shareable device (what is worth waiting for; a node down or drained offers
        nothing until it is back)."""
        if count <= 0:
            return True
        mine = [d for d in self.devices if want.matches(d)]
        if is_fraction(count):
            return any(self.slots(d) > 0 for d in mine)
        return count <= max(placement.capacity(mine).values(), default=0)

    def wanted(self, want: Want) -> list[GpuDevice]:
        """The devices ``want`` may be given (all of them when it asks for nothing)."""
        return [d for d in self.devices if want.matches(d)] if want else list(self.devices)

    def want_refusal(
        self, want: Want, per_worker: float, workers: int = 1
    ) -> tuple[str, str] | None:
        """Why ``workers`` ranks of ``per_worker`` GPUs that ``want`` a model or a pool can
        never be placed here, as (field, message); None when they could (checked at
        submission and at a notebook's spawn; busy devices are waited for)."""
        why = placement.want_refusal(want, self.devices, self.node_pools, per_worker, workers)
        if why or not want or not is_fraction(per_worker):
            return why
        if not any(self.slots(d) > 0 for d in self.wanted(want)):
            return "gpu_model" if want.model else "node_pool", (
                f"no GPU{want.text()} is shared here: ask for whole GPUs, or another model or pool"
            )
        return None

    def known_models(self) -> list[str]:
        """The models of the devices, each named once (what requests may ask for)."""
        return placement.known_models(self.devices)

    def free_by_model(self) -> list[dict]:
        """Per model: how many of its devices are free now, of how many
        (:func:`~.placement.free_by_model`)."""
        with self.db.read() as s:
            busy = s.scalars(
                select(GpuAllocation.device).where(GpuAllocation.instance == self.instance)
            ).all()
        return placement.free_by_model(self.devices, busy)

    def known_pools(self) -> list[str]:
        """The pools of the nodes that take workloads now."""
        return placement.known_pools(self.node_pools)

    def gpu_home(self) -> tuple[int, str]:
        """(the most GPUs one workload can have, what has them): for refusal messages."""
        node, gpus = self.biggest_node()
        if not self.clustered:
            return gpus, "this host"
        return gpus, f"a workload runs on one node and the biggest ({node})"

    def choose(self, free: Sequence[GpuDevice], count: int, want: Want = ANY) -> list[GpuDevice]:
        """Pick ``count`` of the ``free`` devices, all on one node, by the placement policy.
        Empty when no node has enough (one host: the first free ones). Devices that are not
        shareable go first, so that whole GPUs leave the shareable ones to fractions."""
        shared = (lambda d: self.slots(d) > 0) if self.sharing else None
        if want:
            free = [d for d in free if want.matches(d)]
        return placement.choose_devices(free, count, self.policy, self.clustered, shared)

    def node_for_cpu(self, want: Want = ANY) -> str:
        """The node for a workload without GPUs (in the pool ``want`` asks for): where GPUs
        are fewest free (pack; keeps the free GPUs' nodes for GPU work) or most free
        (spread)."""
        if not self.clustered:
            return ""
        nodes = [n for n in self.nodes or [] if want.in_pool(self.node_pools.get(n, ()))]
        if not nodes:
            raise NoGpuAvailable(0, 0, 0, ("none", 0))
        with self.db.read() as s:
            busy = set(
                s.scalars(
                    select(GpuAllocation.device).where(GpuAllocation.instance == self.instance)
                )
            )
        free = {n: 0 for n in nodes}
        for d in self.devices:
            if d.key not in busy and d.node in free:
                free[d.node] += 1
        return placement.node_for_cpu(free, self.policy)

    def reserve(
        self,
        workload: str,
        owner: str,
        kind: str,
        count: float,
        quota: int | None = None,
        want: Want = ANY,
        avoid: Collection[str] = (),
    ) -> list[str]:
        """Give ``count`` free devices to ``workload`` (the ones it holds if it has some).

        A ``count`` below 1 is a fraction of one shareable device (a list of that one device).

        ``quota``: the most GPUs ``owner`` may hold in quota, notebooks and jobs together
        (None: no limit). GPUs lent to the owner's over-quota (preemptible) jobs do not count.
        The count and the insert are one transaction, serialized per owner, so that two
        reservations at once cannot overshoot it (GpuQuotaExceeded).

        ``want``: only devices of that model and/or pool are taken. ``avoid``: devices the
        scheduler's plan set aside for a job waiting before this one (``Plan.held``): never
        taken.
        """
        if count <= 0:
            return []
        if is_fraction(count):
            return self._reserve(workload, owner, kind, count, quota, None, want=want)[0]

        def pick(free: Sequence[GpuDevice]) -> list[list[str]]:
            return [[d.key for d in self.choose(_besides(free, avoid), count, want)]]

        ranks = self._reserve(workload, owner, kind, count, quota, pick, want=want)
        return sorted(ranks[0]) if len(ranks) == 1 else sorted(sum(ranks, []))

    def reserve_gang(
        self,
        workload: str,
        owner: str,
        kind: str,
        per_worker: int,
        workers: int,
        quota: int | None = None,
        want: Want = ANY,
        avoid: Collection[str] = (),
    ) -> list[list[str]]:
        """Book ``workers`` ranks of ``per_worker`` devices each for ``workload``, every
        rank's on one node, all in one transaction or none (a distributed job), of the model
        and pool ``want`` asks for. Returns each rank's devices (what it holds already,
        regrouped, if it holds some). ``avoid``: never taken (see :meth:`reserve`)."""
        if per_worker <= 0:
            return [[] for _ in range(workers)]

        def pick(free: Sequence[GpuDevice]) -> list[list[str]]:
            by_node: dict[str, list[str]] = {}
            for d in _besides(free, avoid):
                if want.matches(d):
                    by_node.setdefault(d.node, []).append(d.key)
            return placement.choose_gang(
                by_node, per_worker, workers, spread=self.policy == "spread"
            )

        return self._reserve(
            workload, owner, kind, per_worker * workers, quota, pick, workers, want
        )

    def gang_slots(self) -> dict[int, int]:
        """Workers of g GPUs (g from 1 to the biggest node's) the nodes hold at once."""
        return placement.gang_slots(placement.capacity(self.devices))

    def gang_refusal(self, per_worker: int, workers: int) -> str | None:
        """Why ``workers`` ranks of ``per_worker`` GPUs can never be placed (all nodes
        empty), or None: checked at submission."""
        if workers <= 1 or per_worker <= 0:
            return None
        capacity = placement.capacity(self.devices)
        if placement.gang_fits(capacity, per_worker, workers):
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
        count: float,
        quota: int | None,
        pick: Callable[[Sequence[GpuDevice]], list[list[str]]] | None,
        workers: int = 1,
        want: Want = ANY,
    ) -> list[list[str]]:
        """The reservation's one transaction: ``pick`` chooses whole devices among the free
        ones (per rank); without it, ``count`` is a fraction of one shareable device."""
        for attempt in range(RESERVE_ATTEMPTS):
            try:
                with self.db.session() as s:
                    if self.sharing:
                        # a whole device (share 0) and a slot of it (share k) are different
                        # rows to the unique constraint: with shareable devices every
                        # reservation of the installation is serialized (PostgreSQL)
                        self.db.serialize(s, "gpulab-gpus", self.instance)
                    elif quota is not None:
                        self.db.serialize(s, "gpulab-gpus", self.instance, owner)
                    held = s.execute(
                        select(
                            GpuAllocation.device,
                            GpuAllocation.workload,
                            GpuAllocation.owner,
                            GpuAllocation.share,
                        ).where(GpuAllocation.instance == self.instance)
                    ).all()
                    mine = sorted({d for d, w, _, _ in held if w == workload})
                    if mine:
                        if workers == 1:
                            return [mine]
                        return placement.regroup(mine, int(count) // workers, workers)
                    if quota is not None:
                        lent = self._lent_workloads(s, owner)
                        in_quota = sum(
                            self.weight(d, sh)
                            for d, w, o, sh in held
                            if o == owner and w not in lent
                        )
                        if in_quota + count > quota + 1e-9:
                            raise GpuQuotaExceeded(count, round(in_quota, 4), quota)
                    if pick is None:
                        rows = self._pick_share(held, count, want)
                        chosen = [[rows[0][0]]]
                    else:
                        busy = {d for d, _, _, _ in held}
                        free = [d for d in self.devices if d.key not in busy]
                        chosen = [ds for ds in pick(free) if ds]
                        if not chosen:
                            biggest = self.biggest_node() if self.clustered else None
                            if want:
                                raise NoWantedGpu(int(count), want, self.wanted(want), busy)
                            raise NoGpuAvailable(int(count), len(self.devices), len(busy), biggest)
                        rows = [(d, 0) for ds in chosen for d in ds]
                    for dev, share in rows:
                        s.add(
                            GpuAllocation(
                                instance=self.instance,
                                device=dev,
                                share=share,
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

    def weight(self, key: str, share: int) -> float:
        """How much of a GPU one ledger row is: 1 for a whole device, 1/slots for a slot."""
        if share == 0:
            return 1.0
        dev = next((d for d in self.devices if d.key == key), None)
        slots = self.slots(dev) if dev is not None else 0
        return 1 / slots if slots else 1.0

    def _pick_share(self, held, fraction: float, want: Want = ANY) -> list[tuple[str, int]]:
        """The rows (device, slot number) that give ``fraction`` of a shareable device, from
        the ledger's rows ``held`` (device, workload, owner, share); NoGpuShareAvailable when no
        shareable device has them free."""
        whole = {d for d, _, _, sh in held if sh == 0}
        taken: dict[str, set[int]] = {}
        for d, _, _, sh in held:
            if sh:
                taken.setdefault(d, set()).add(sh)
        counts = self.slot_counts()
        if want:
            ok = {d.key for d in self.wanted(want)}
            counts = {k: n for k, n in counts.items() if k in ok}
        free = {k: n - len(taken.get(k, ())) for k, n in counts.items() if k not in whole}
        picked = pick_shared(free, counts, fraction, spread=self.policy == "spread")
        if picked is None:
            raise NoGpuShareAvailable(
                fraction, {k: (free.get(k, 0), n) for k, n in sorted(counts.items())}
            )
        key, need = picked
        numbers = [n for n in range(1, counts[key] + 1) if n not in taken.get(key, set())]
        return [(key, n) for n in numbers[:need]]

    def _lent_workloads(self, s, owner: str) -> set[str]:
        """Workloads of ``owner``'s jobs that run over quota on lent GPUs."""
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
            return sorted(set(rows))

    def held_by(self, workload: str) -> list[str]:
        with self.db.read() as s:
            return sorted(
                set(
                    s.scalars(
                        select(GpuAllocation.device).where(
                            GpuAllocation.instance == self.instance,
                            GpuAllocation.workload == workload,
                        )
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
                    # how much of a GPU the row is (1, or 1/slots for a slot of a shared one)
                    "gpus": self.weight(r.device, r.share),
                    "workload": r.workload,
                    "kind": r.kind,
                    "owner": r.owner,
                    "since": r.since.isoformat().replace("+00:00", "Z"),
                }
                for r in rows
            ]

    def holdings(self, allocations: list[dict]) -> list[dict]:
        """Every device and what holds it, from the ledger's rows ``allocations``
        (:meth:`allocations`): its JSON (``device``), its ``key``, its ``held``
        (:func:`holders`), its ``slots`` (0: not shareable) and how many of them are ``used``;
        then the rows of devices no longer configured (model "(not configured)", ``key``
        None), so that nothing held is hidden."""
        by_device: dict[str, list[dict]] = {}
        for a in allocations:
            by_device.setdefault(a["device"], []).append(a)
        out = []
        for dev in self.devices:
            slots = self.slots(dev)
            held = holders(by_device.pop(dev.key, []), slots)
            used = sum(len(a["slots"]) for a in held) if held and held[0]["slots"] else 0
            out.append(
                {
                    "device": dev.to_json(),
                    "key": dev.key,
                    "held": held,
                    "slots": slots,
                    "used": used,
                }
            )
        for key, rows in sorted(by_device.items()):
            out.append(
                {
                    "device": {"id": key, "model": "(not configured)", "memory": ""},
                    "key": None,
                    "held": holders(rows, 0),
                    "slots": 0,
                    "used": 0,
                }
            )
        return out

    def shares(self) -> dict[str, float]:
        """{workload: fraction of a GPU} of the workloads that hold slots of shared devices."""
        out: dict[str, float] = {}
        counts = self.slot_counts()
        with self.db.read() as s:
            rows = s.execute(
                select(GpuAllocation.device, GpuAllocation.workload).where(
                    GpuAllocation.instance == self.instance, GpuAllocation.share > 0
                )
            ).all()
        held: dict[str, tuple[str, int]] = {}  # workload -> (device, slots it holds)
        for d, w in rows:
            held[w] = (d, held.get(w, (d, 0))[1] + 1)
        for w, (d, k) in held.items():
            out[w] = share_of(k, counts.get(d, 0))
        return out

    def shared_free(self) -> dict[str, tuple[int, int]]:
        """{device key: (free slots, slots)} of the shareable devices now (a device that a
        whole-GPU workload holds has none free)."""
        counts = self.slot_counts()
        if not counts:
            return {}
        with self.db.read() as s:
            rows = s.execute(
                select(GpuAllocation.device, GpuAllocation.share).where(
                    GpuAllocation.instance == self.instance
                )
            ).all()
        used: dict[str, int] = {}
        for d, sh in rows:
            used[d] = counts.get(d, 0) if sh == 0 else used.get(d, 0) + 1
        return {k: (max(0, n - used.get(k, 0)), n) for k, n in counts.items()}

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


def _besides(free: Sequence[GpuDevice], avoid: Collection[str]) -> Sequence[GpuDevice]:
    """The ``free`` devices but those to ``avoid``."""
    if not avoid:
        return free
    keys = set(avoid)
    return [d for d in free if d.key not in keys]
