"""Which node and devices a workload or a gang gets (pure, no I/O).

The ledger (:mod:`gpulab.gpus.ledger`) books what these functions choose, in one transaction;
the scheduler (:mod:`gpulab.jobs.scheduler`) asks them what would fit, with the same answer.
Devices are ledger keys ("node/id", "id" on one host) or :class:`~.inventory.GpuDevice`.

Policies: ``pack`` fills the fullest node that still fits (keeping whole nodes free for big
work); ``spread`` takes the node with the most free.

A request may ask for a GPU model and/or a node pool (:class:`Want`): only the devices that
match are candidates, before pack or spread chooses among them. A model matches by its
normalised name (:func:`model_key`: case, spaces, hyphens and underscores folded), exactly: an
admin gives short names (``gpu_models``, a node's ``gpulab.gpu-model`` label) and users pick
one of the names listed (:func:`known_models`); "A100" never silently matches an
"A100-SXM4-80GB" and an "A100 MIG 1g.10gb" alike. A pool matches a device whose node is in it
(names compared without case).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..resources import MODEL_PATTERN, POOL_PATTERN, POOL_RE, model_key
from .inventory import GpuDevice, node_of

__all__ = [
    "ANY",
    "MODEL_PATTERN",
    "POOL_PATTERN",
    "POOL_RE",
    "Want",
    "biggest_node",
    "capacity",
    "choose_devices",
    "choose_gang",
    "gang_fits",
    "gang_slots",
    "free_by_model",
    "known_models",
    "known_pools",
    "model_key",
    "node_for_cpu",
    "regroup",
    "want_refusal",
]


@dataclass(frozen=True)
class Want:
    """What a request asks of its devices beyond a count: a GPU ``model`` and/or a node
    ``pool`` ("" for any). False when it asks for neither."""

    model: str = ""
    pool: str = ""

    def __bool__(self) -> bool:
        return bool(self.model or self.pool)

    def in_pool(self, pools: Iterable[str]) -> bool:
        """Whether a node of ``pools`` is one this request may run on."""
        return not self.pool or self.pool.casefold() in {p.casefold() for p in pools}

    def matches(self, device: GpuDevice) -> bool:
        """Whether ``device`` may be given to this request."""
        if self.model and model_key(device.model) != model_key(self.model):
            return False
        return self.in_pool(device.pools)

    def text(self) -> str:
        """ " of model 'A100' in pool 'big'", for messages ("" when it asks for neither)."""
        out = f" of model {self.model!r}" if self.model else ""
        return out + (f" in pool {self.pool!r}" if self.pool else "")

    def to_json(self) -> dict:
        return {"gpu_model": self.model or None, "node_pool": self.pool or None}


#: a request that asks for no model and no pool
ANY = Want()


def known_models(devices: Iterable[GpuDevice]) -> list[str]:
    """The models of ``devices``, one name each (the first spelling met), sorted."""
    seen: dict[str, str] = {}
    for d in devices:
        if d.model:
            seen.setdefault(model_key(d.model), d.model)
    return sorted(seen.values(), key=str.casefold)


def free_by_model(devices: Iterable[GpuDevice], busy: Iterable[str]) -> list[dict]:
    """Per model (each named once, sorted): ``model``, ``free`` (its devices that no workload
    holds any share of, by ledger key in ``busy``) and ``total``; devices without a model
    apart. What a form shows beside its model choice."""
    held = set(busy)
    rows: dict[str, dict] = {}
    for d in devices:
        if not d.model:
            continue
        row = rows.setdefault(model_key(d.model), {"model": d.model, "free": 0, "total": 0})
        row["total"] += 1
        row["free"] += d.key not in held
    return sorted(rows.values(), key=lambda r: r["model"].casefold())


def known_pools(node_pools: Mapping[str, Sequence[str]]) -> list[str]:
    """The pools of the nodes (node -> its pools), sorted, each once."""
    seen: dict[str, str] = {}
    for pools in node_pools.values():
        for p in pools:
            seen.setdefault(p.casefold(), p)
    return sorted(seen.values(), key=str.casefold)


def want_refusal(
    want: Want,
    devices: Sequence[GpuDevice],
    node_pools: Mapping[str, Sequence[str]],
    per_worker: float,
    workers: int = 1,
) -> tuple[str, str] | None:
    """Why a request for ``workers`` ranks of ``per_worker`` GPUs that ``want`` a model or a
    pool can never be placed, even with every device free, as (field, message); None when it
    could. ``devices``: every device that may be handed out; ``node_pools``: each node's pools
    (one host: ``{"": node_pools}``). Only what no node could ever give is refused: devices
    merely busy are waited for."""
    if not want:
        return None
    models = known_models(devices)
    if want.model and not any(model_key(d.model) == model_key(want.model) for d in devices):
        listed = ", ".join(models) or "none is named (the admin sets gpu_models)"
        return "gpu_model", f"gpu_model: no GPU of model {want.model!r} here; models: {listed}"
    if want.pool and not any(want.in_pool(ps) for ps in node_pools.values()):
        listed = ", ".join(known_pools(node_pools)) or "none"
        return "node_pool", f"node_pool: no node in pool {want.pool!r} here; pools: {listed}"
    if per_worker <= 0:
        if want.model:
            return "gpu_model", (
                f"gpu_model: {want.model!r} asks for a GPU model but no GPU is requested: "
                "ask for at least one GPU, or no model"
            )
        return None
    mine = [d for d in devices if want.matches(d)]
    if not mine:  # a model and a pool that each exist, never together
        there = known_models(d for d in devices if want.in_pool(d.pools))
        return "node_pool", (
            f"node_pool: no GPU of model {want.model!r} in pool {want.pool!r}; that pool has "
            f"{', '.join(there) or 'no GPU'}"
        )
    if per_worker < 1:
        return None  # a share of a device: whether one is shareable is the ledger's to say
    cap = capacity(mine)
    if gang_fits(cap, int(per_worker), workers):
        return None
    most = max(cap.values())
    if workers > 1:
        slots = sum(c // int(per_worker) for c in cap.values())
        return "workers", (
            f"{workers} workers of {int(per_worker)} GPU(s){want.text()} requested but at "
            f"most {slots} such workers fit at once ({len(mine)} such GPUs, at most {most} "
            "on one node): ask for fewer workers or fewer GPUs each"
        )
    where = "on one node" if len(cap) > 1 or "" not in cap else "here"
    return "resources.gpus", (
        f"{int(per_worker)} GPU(s){want.text()} requested but there are at most {most} {where}"
        f": ask for {most} or fewer"
    )


def capacity(devices: Iterable[GpuDevice]) -> dict[str, int]:
    """{node: how many devices it has} ("" for one host)."""
    out: dict[str, int] = {}
    for d in devices:
        out[d.node] = out.get(d.node, 0) + 1
    return out


def biggest_node(devices: Iterable[GpuDevice], nodes: Sequence[str]) -> tuple[str, int]:
    """(node, GPUs) of the cluster node with the most GPUs; ("none", 0) without nodes."""
    counts = {n: 0 for n in nodes}
    for d in devices:
        counts[d.node] = counts.get(d.node, 0) + 1
    if not counts:
        return "none", 0
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))


def choose_devices(
    free: Sequence[GpuDevice],
    count: int,
    policy: str = "pack",
    clustered: bool = False,
    shared: Callable[[GpuDevice], bool] | None = None,
) -> list[GpuDevice]:
    """Pick ``count`` of the ``free`` devices, all on one node, by the placement policy.
    Empty when no node has enough (one host: the first free ones). Devices that are not
    ``shared`` go first, so that whole GPUs leave the shareable ones to fractions."""
    if shared is not None:
        free = sorted(free, key=shared)
    if not clustered:
        return list(free[:count]) if len(free) >= count else []
    by_node: dict[str, list[GpuDevice]] = {}
    for d in free:
        by_node.setdefault(d.node, []).append(d)
    fits = [(n, ds) for n, ds in by_node.items() if len(ds) >= count]
    if not fits:
        return []
    if policy == "spread":
        node, ds = max(fits, key=lambda f: (len(f[1]), f[0]))
    else:  # pack: the fullest node that still fits keeps whole nodes free for big work
        node, ds = min(fits, key=lambda f: (len(f[1]), f[0]))
    return ds[:count]


def node_for_cpu(free_gpus: Mapping[str, int], policy: str = "pack") -> str:
    """The node for a workload without GPUs, from {node: GPUs free}: where GPUs are fewest
    free (pack; keeps the free GPUs' nodes for GPU work) or most free (spread)."""
    pick = max if policy == "spread" else min
    return pick(sorted(free_gpus), key=lambda n: free_gpus[n])


def choose_gang(
    free_by_node: dict[str, list[str]], per_worker: int, workers: int, spread: bool = False
) -> list[list[str]]:
    """Each rank's ``per_worker`` devices from the free ones (node -> free device keys, in
    order), every rank's on one node; several ranks may share a node. Empty when the whole
    gang does not fit now: nothing is half-placed.

    ``pack`` fills the fullest nodes that fit first (keeping whole nodes free for big work);
    ``spread`` puts each next rank on the node with the most devices still free."""
    if per_worker <= 0 or workers <= 0:
        return []
    pools = {n: list(ds) for n, ds in free_by_node.items() if len(ds) >= per_worker}
    if sum(len(ds) // per_worker for ds in pools.values()) < workers:
        return []
    out: list[list[str]] = []
    if spread:
        mine: dict[str, int] = {}  # ties go to the node with fewer of this gang's ranks
        for _ in range(workers):
            fit = [n for n in pools if len(pools[n]) >= per_worker]
            node = max(fit, key=lambda n: (len(pools[n]), -mine.get(n, 0), n))
            mine[node] = mine.get(node, 0) + 1
            out.append(pools[node][:per_worker])
            del pools[node][:per_worker]
        return out
    for node in sorted(pools, key=lambda n: (len(pools[n]), n)):
        while len(out) < workers and len(pools[node]) >= per_worker:
            out.append(pools[node][:per_worker])
            del pools[node][:per_worker]
    return out


def gang_fits(capacity: dict[str, int], per_worker: int, workers: int) -> bool:
    """Whether ``workers`` ranks of ``per_worker`` GPUs fit the nodes' ``capacity`` at all
    (every node empty): what decides a refusal at submission."""
    if per_worker <= 0:
        return True
    return sum(c // per_worker for c in capacity.values()) >= workers


def gang_slots(capacity: Mapping[str, int]) -> dict[int, int]:
    """Workers of g GPUs (g from 1 to the biggest node's) the nodes hold at once."""
    most = max(capacity.values(), default=0)
    return {g: sum(c // g for c in capacity.values()) for g in range(1, most + 1)}


def regroup(held: Sequence[str], per_worker: int, workers: int) -> list[list[str]]:
    """Each rank's devices again from what a gang's workload holds (a placement retried
    after a crash between the booking and its record): node by node, ``per_worker`` each.
    Every rank's devices were booked on one node, so chunks never straddle two."""
    by_node: dict[str, list[str]] = {}
    for key in sorted(held):
        by_node.setdefault(node_of(key), []).append(key)
    out = []
    for ds in by_node.values():
        out += [ds[i : i + per_worker] for i in range(0, len(ds), per_worker)]
    return out[:workers] if len(out) >= workers else []
