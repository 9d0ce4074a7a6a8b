"""Distributed jobs: N workers (containers) that live and die as one job. Pure, no I/O.

A job with ``workers: N`` runs N containers, ranks 0..N-1, each with the job's ``resources``.
They are placed together or not at all (the ledger books every rank's GPUs in one
transaction), join a network of their own that no other job or user reaches, and find each
other by stable names (``worker-0`` ... ``worker-{N-1}``, DNS aliases on that network). Each
is told what ``torch.distributed`` (``init_method="env://"``) and ``torchrun`` expect.

Naming: rank 0 keeps the name a one-container job has (logs, ports, exec and every existing
record find it as before); rank k > 0 is ``<name>-r<k>``. The job record's ``devices`` holds
each rank's devices, ranks separated by ``;`` (``"0,1;2,3"``; one rank: ``"0,1"`` as before).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..gpus.inventory import node_of
from .recovery import Container

#: the port rank 0 listens on for the rendezvous (torch.distributed's usual default)
MASTER_PORT = 29500
#: what gpulab sets in every worker of a distributed job (a submission may not set them)
DISTRIBUTED_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GPULAB_WORKERS",
    "GPULAB_RANK",
    # torchrun reads its options from PET_* (as Kubeflow's PyTorchJob sets them)
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)


@dataclass(frozen=True)
class Rank:
    """One worker of a job: its rank, workload name, node ("" on one host) and devices."""

    rank: int
    name: str
    node: str
    devices: tuple[str, ...]


def workers_of(job: dict) -> int:
    """How many workers (containers) a job (its API JSON) runs: more than one for a
    distributed job."""
    try:
        return max(1, int((job.get("spec") or {}).get("workers") or 1))
    except (TypeError, ValueError):
        return 1


def rank_name(name: str, rank: int) -> str:
    """The workload name of ``rank`` of the job whose (rank 0) workload is ``name``."""
    return name if rank == 0 else f"{name}-r{rank}"


def rank_alias(rank: int) -> str:
    """The name the other workers resolve ``rank`` by, on the job's own network."""
    return f"worker-{rank}"


def encode_devices(per_rank: Sequence[Sequence[str]]) -> str:
    return ";".join(",".join(ds) for ds in per_rank)


def decode_devices(text: str, workers: int) -> list[list[str]]:
    """Each rank's devices from the record's ``devices`` (an empty field: none for each)."""
    parts = (text or "").split(";")
    out = [[d for d in p.split(",") if d] for p in parts]
    return (out + [[] for _ in range(workers)])[:workers] if workers > 1 else [sum(out, [])]


def ranks(name: str, workers: int, devices: str, node: str) -> list[Rank]:
    """The job's ranks from its record: ``name`` (its container), ``workers`` (its spec),
    ``devices`` and ``node`` (where placed; a GPU rank's node is its devices')."""
    out = []
    nodes = (node or "").split(",")  # each rank's (a GPU gang), or one for all
    for r, ds in enumerate(decode_devices(devices, max(1, workers))):
        where = node_of(ds[0]) if ds else nodes[r] if len(nodes) == workers else nodes[0]
        out.append(Rank(r, rank_name(name, r), where, tuple(ds)))
    return out


def nodes_of(gang: Iterable[Rank]) -> list[str]:
    """The distinct nodes the ranks run on, rank 0's first (data is pulled on each)."""
    seen: list[str] = []
    for r in gang:
        if r.node not in seen:
            seen.append(r.node)
    return seen


def distributed_env(rank: int, workers: int) -> dict[str, str]:
    """What one worker is told (``workers`` > 1): one process per worker by default, so
    ``RANK`` = ``NODE_RANK`` and ``LOCAL_RANK`` = 0; a command that starts several processes
    per worker (``torchrun --nproc-per-node``) takes ``PET_NNODES``/``PET_NODE_RANK`` and
    sets the per-process values itself."""
    master = rank_alias(0)
    return {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(workers),
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "NODE_RANK": str(rank),
        "GPULAB_WORKERS": str(workers),
        "GPULAB_RANK": str(rank),
        "PET_NNODES": str(workers),
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": str(MASTER_PORT),
    }


def combine(found: Sequence[Container]) -> Container:
    """One view of a gang's containers for :func:`~gpulab.jobs.recovery.decide`.

    A rank missing means the gang is not whole (ABSENT: a start cut short, or lost). A gang
    is RUNNING or ENDED (in this life) only when every rank is one of those; a mix with a
    rank left from an earlier life (a whole-gang restart cut short) is STALE, so that the
    restart is finished (only the ranks not running are started again)."""
    if not found:
        return Container.ABSENT
    if any(c is Container.ABSENT for c in found):
        return Container.ABSENT
    if any(c is Container.STALE for c in found):
        return Container.STALE
    if any(c is Container.RUNNING for c in found):
        return Container.RUNNING
    return Container.ENDED


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


_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")


def strip_stamps(log: bytes) -> bytes:
    """A timestamped log (``timestamps=True``) as its command printed it."""
    return b"".join(
        line.partition(b" ")[2] if _STAMP.match(line) else line
        for line in log.splitlines(keepends=True)
    )


def _lines(rank: int, log: bytes) -> Iterator[tuple[bytes, int, int, bytes]]:
    """(stamp key, rank, line number, prefixed line) of one rank's log, in its order; a line
    without a stamp (cut, or not from the engine) keeps the key of the line before it."""
    key = b""
    prefix = b"[rank %d] " % rank
    lines = log.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    for i, line in enumerate(lines):
        # "2026-11-23T10:00:00.123Z text": byte checks, no regex (hundreds of thousands)
        sp = line.find(b" ", 19, 32)
        if sp > 0 and line[sp - 1] == 90 and line[10] == 84:  # 'Z', 'T'
            whole, _, frac = line[: sp - 1].partition(b".")
            key, line = whole + b"." + frac.ljust(9, b"0"), line[sp + 1 :]
        yield key, rank, i, prefix + line + b"\n"


def merge_logs(per_rank: Sequence[bytes]) -> bytes:
    """All ranks' timestamped logs as one, in time order (rank order for equal times), each
    line prefixed ``[rank K] `` and without its stamp. Each rank's log is already in time
    order: a k-way merge (linear; the caller bounds each rank's bytes)."""
    merged = heapq.merge(*(_lines(rank, log) for rank, log in enumerate(per_rank)))
    return b"".join(x[3] for x in merged)
