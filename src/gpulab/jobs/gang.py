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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..gpus.inventory import node_of
from ..names import rank_alias, rank_name
from .refusals import Invalid, NotFound

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
    return spec_workers(job.get("spec"))


def spec_workers(spec: dict | None) -> int:
    """How many workers a job's spec (as stored: its JSON) asks for; 1 where it says none
    (older records)."""
    try:
        return max(1, int((spec or {}).get("workers") or 1))
    except (TypeError, ValueError):
        return 1


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


def rank_of(text: str, job_id: str, workers: int) -> int:
    """The rank a caller names (a ``rank`` query parameter) of a ``workers``-rank job: Invalid
    if it is no whole number, NotFound if the job has no such worker (as for any part of a
    job that does not exist)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise Invalid(f"rank must be a whole number, not {text[:20]!r}", field="rank")
    if int(text) >= workers:
        plural = "s" if workers > 1 else ""
        raise NotFound(f"job {job_id} has no rank {int(text)}: it has {workers} worker{plural}")
    return int(text)
