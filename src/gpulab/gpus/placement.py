"""Which node and devices a workload or a gang gets (pure, no I/O).

The ledger (:mod:`gpulab.gpus.ledger`) books what these functions choose, in one transaction;
the scheduler (:mod:`gpulab.jobs.scheduler`) asks them what would fit, with the same answer.
Devices are ledger keys ("node/id", "id" on one host) or :class:`~.inventory.GpuDevice`.

Policies: ``pack`` fills the fullest node that still fits (keeping whole nodes free for big
work); ``spread`` takes the node with the most free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from .inventory import GpuDevice, node_of

__all__ = [
    "biggest_node",
    "capacity",
    "choose_devices",
    "choose_gang",
    "gang_fits",
    "gang_slots",
    "node_for_cpu",
    "regroup",
]


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
