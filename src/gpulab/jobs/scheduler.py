"""Pure placement decisions for training jobs: which queued jobs start on which GPUs, and which
over-quota preemptible jobs must give their GPUs back.

The caller gathers the world (queued jobs, active jobs holding GPUs, the free device IDs: GPUs
held by notebooks or jobs are simply not free), calls :func:`plan` and carries the
:class:`Plan` out: start each placement on exactly its devices, send each preempted job SIGTERM
(it is re-queued after its grace period). Planning again after any change is always safe.

Rules
-----
1. **Order.** Queued jobs are considered by priority (highest first), then fair share (the
   owner's most-used group's factor, then the owner's own, higher first: see
   :mod:`gpulab.fairshare`; 1 and 1 when not given), then submission time (oldest first:
   FIFO within a priority and an owner), then a task's index in its array, then id (for
   determinism).
2. **Quota counts.** A user's jobs in the quota states (QUEUED, INITIALIZING, PENDING,
   RUNNING; those running beyond the quota aside) are capped by the quota's job count at
   submission (``JobRecords.create``; a preemptible job is never refused for it); here, the
   quota's GPUs and jobs cap what *starts*.
3. **Quota.** A user's quota (:func:`~gpulab.resources.quota_for`: their own, else the most
   generous of their groups field by field, else the default; ``None`` means unlimited) caps
   the GPUs and the number of their *in-quota* active jobs (INITIALIZING, PENDING, RUNNING).
   The GPUs their notebooks hold (``held_outside``) count against the same GPU quota.
   Over-quota jobs do not count. A zero-GPU job needs no device but counts as one job.
   A notebook waiting for GPUs (``kind`` "notebook") is planned like an in-quota,
   non-preemptible job of its owner: it needs their GPU quota, not a job of their count,
   and may have over-quota jobs preempted for it (rule 5).
4. **In-quota first.** A first pass starts the jobs that fit within their owner's quota, in
   order, on free GPUs. A job that does not fit does not block lower ones that do (backfill).
5. **Preemption.** When an in-quota job (preemptible or not) lacks free GPUs and over-quota
   preemptible jobs hold enough GPUs to make up the difference, victims are chosen among them
   (lowest priority first, then the heaviest group's and user's by fair share, then most
   recently started, then id) until enough GPUs would be
   free. They are listed in ``preempt``; the waiting job does **not** start in this plan but
   in a later one, once they are gone. Until then it keeps the free GPUs it will need and its
   share of its owner's quota: no lower job takes them in this plan. If the over-quota jobs
   cannot make up the difference, nothing is preempted and nothing is held back.
   Jobs already on their way out (preempted and in their grace period, or being interrupted)
   are passed as active with ``releasing=True``: their GPUs are not free yet but will be, so
   they count towards a waiting job's need before any new victim is chosen (and the free GPUs
   stay held for it in the plans that follow the preemption, not only in the first one).
   Releasing jobs never count against a quota and are never chosen as victims.
6. **Over quota.** A second pass, in the same order, starts preemptible jobs that are over
   their owner's quota (GPUs or job count) on the GPUs still free, marked ``over_quota``. So
   idle GPUs are lent out only after all in-quota work had its turn, and a lent GPU is never
   taken back in the plan that lent it. A non-preemptible job never runs over quota.
7. **Devices and node shape.** A job of ``workers`` ranks needs ``gpus / workers`` GPUs per
   rank, each rank's on one node (several ranks may share a node): the free devices are
   grouped by ``node_of`` (one host: one node) and a job starts only when every rank fits
   (:func:`~gpulab.gpus.placement.choose_gang`, ``pack`` or ``spread`` as the ledger places them).
   A job that has enough free GPUs in count but not in shape (2 ranks of 2 GPUs on four nodes
   with one free each) does not start and holds nothing, so the jobs behind it may use those
   GPUs (backfill), unless preempting over-quota jobs would give it its shape (rule 5).
   Within a node the devices are taken in the order the caller gave them
   (list them lowest first); a device is handed out at most once per plan.
   With ``node_of`` given, preemption checks the shape too: victims are chosen (in the order
   of rule 5) until the free GPUs, those of the jobs already releasing and the victims' would
   hold the waiting job's ranks; if even all of them would not, nothing is preempted (no
   job is preempted again and again for a gang that still would not fit).

8. **Job arrays.** A task of an array (``array``: its id) starts only while fewer than its
   ``parallelism`` tasks of that array are active (releasing ones included: their container
   still runs) or started or held for in this plan; one that waits for its turn holds
   nothing and preempts nothing. An array counts as **one** job against its owner's quota's
   job count, however many of its tasks are active in quota (rule 3); each task's GPUs count
   as any job's.

9. **Models and pools.** A job or a notebook that asks for a GPU model and/or a node pool
   (``want``) is placed on matching devices only (``devices``: each device key's
   :class:`~gpulab.gpus.inventory.GpuDevice`, for its model and pool; a key not in it matches
   no request that asks for one). It waits while they are busy, however many others are free
   (which the jobs behind it may take), is held for only the matching free devices (listed in
   ``Plan.held``: the supervisor books nothing it starts on them), and preempts only
   over-quota jobs that hold matching devices, counting only those.

Known trade-off of backfill: a large in-quota job may wait while smaller ones keep starting;
only over-quota work is ever preempted for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..gpus.inventory import GpuDevice
from ..gpus.placement import Want, choose_gang
from ..resources import Quota, beyond_gpus, quota_for

__all__ = [
    "ActiveJob",
    "Placement",
    "Plan",
    "QueuedJob",
    "can_ever_fit",
    "plan",
    "queue_order",
]


@dataclass(frozen=True)
class QueuedJob:
    id: str
    owner: str
    groups: frozenset[str]
    gpus: int
    priority: int
    submitted: float
    preemptible: bool = False
    #: ranks of a distributed job; ``gpus`` is the total, ``gpus // workers`` each rank's
    workers: int = 1
    #: the owner's fair share: (their most-used group's factor, their own), higher first
    standing: tuple[float, float] = (1.0, 1.0)
    #: "job", or "notebook": a notebook waiting for GPUs (gpus/waits.py) is planned in the
    #: same order; it counts against its owner's GPU quota only (it is no job)
    kind: str = "job"
    #: a task's array ("" for a plain job) and the most of its tasks active at once
    array: str = ""
    parallelism: int = 0
    #: a task's index in its array: an array's tasks (submitted together) go in index order
    index: int = 0
    #: the GPU model and/or node pool it asks for (rule 9)
    want: Want = Want()


@dataclass(frozen=True)
class ActiveJob:
    """A job holding GPUs: INITIALIZING, PENDING or RUNNING, or (``releasing``) on its way out,
    e.g. preempted and checkpointing during its grace period."""

    id: str
    owner: str
    groups: frozenset[str]
    gpus: int
    preemptible: bool
    priority: int
    started: float
    over_quota: bool = False
    releasing: bool = False
    #: the device keys it holds (what a preemption would free, for the node-shape check)
    devices: tuple[str, ...] = ()
    #: the owner's fair share, as :attr:`QueuedJob.standing`: the lowest is preempted first
    standing: tuple[float, float] = (1.0, 1.0)
    #: a task's array ("" for a plain job)
    array: str = ""


@dataclass(frozen=True)
class Placement:
    job_id: str
    devices: tuple[str, ...]
    over_quota: bool = False


@dataclass
class Plan:
    start: list[Placement] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    #: free devices set aside for waiting jobs (their victims or the jobs ending go first):
    #: the ledger books nothing of this plan's on them (``avoid``)
    held: list[str] = field(default_factory=list)


def can_ever_fit(
    gpus: int,
    host_gpus: int,
    quota: Quota,
    preemptible: bool = False,
    gpu_home: str = "this host",
) -> str | None:
    """Why a job of ``gpus`` GPUs can never run here (checked at submission), or None.
    ``host_gpus``: the most GPUs one workload can have (the biggest node's), ``gpu_home`` what
    has them, for the message."""
    too_many = beyond_gpus(gpus, host_gpus, gpu_home)
    if too_many:
        return too_many
    if preemptible:
        return None
    if quota.gpus is not None and gpus > quota.gpus:
        return (
            f"{gpus} GPUs requested but your quota allows {quota.gpus}; "
            "submit it as preemptible to use idle GPUs beyond your quota"
        )
    if quota.jobs == 0:
        return "your quota allows no running jobs; submit it as preemptible to use idle GPUs"
    return None


def queue_order(job: QueuedJob) -> tuple:
    """The order in which queued jobs are considered (rule 1)."""
    return (-job.priority, -job.standing[0], -job.standing[1], job.submitted, job.index, job.id)


def plan(
    queued: Sequence[QueuedJob],
    active: Sequence[ActiveJob],
    free_devices: Sequence[str],
    *,
    default_quota: Quota | None = None,
    user_quotas: Mapping[str, Quota] | None = None,
    group_quotas: Mapping[str, Quota] | None = None,
    held_outside: Mapping[str, int] | None = None,
    node_of: Callable[[str], str] | None = None,
    spread: bool = False,
    devices: Mapping[str, GpuDevice] | None = None,
) -> Plan:
    """Decide what starts now and what is preempted (see the module's rules).
    ``node_of``: a device's node (None: all on one host); ``spread``: the ledger's placement
    policy, so that the devices set aside in a plan are the ones the ledger will book;
    ``devices``: each device key's device, for the requests that ask for a model or a pool
    (rule 9)."""
    known: Mapping[str, GpuDevice] = devices or {}
    default_quota = default_quota or Quota()
    user_quotas = user_quotas or {}
    group_quotas = group_quotas or {}

    def quota(owner: str, groups: frozenset[str]) -> Quota:
        return quota_for(owner, groups, default_quota, user_quotas, group_quotas)

    free = list(dict.fromkeys(free_devices))
    gpus_used: dict[str, int] = dict(held_outside or {})
    jobs_used: dict[str, int] = {}
    incoming = sum(a.gpus for a in active if a.releasing)  # GPUs about to be free
    arriving_devices = [d for a in active if a.releasing for d in a.devices]
    #: the arrays counted in their owner's jobs (rule 8: one job each), and each array's
    #: tasks active, started or held for (its parallelism caps them)
    counted: set[str] = set()
    array_active: dict[str, int] = {}
    for a in active:
        if a.array:
            array_active[a.array] = array_active.get(a.array, 0) + 1
        if not a.over_quota and not a.releasing:
            gpus_used[a.owner] = gpus_used.get(a.owner, 0) + a.gpus
            if not a.array or a.array not in counted:
                jobs_used[a.owner] = jobs_used.get(a.owner, 0) + 1
                if a.array:
                    counted.add(a.array)
    victims_left = sorted(
        (a for a in active if a.over_quota and a.preemptible and a.gpus > 0 and not a.releasing),
        key=lambda a: (a.priority, a.standing, -a.started, a.id),
    )
    result = Plan()
    over_quota: list[QueuedJob] = []

    def take(n: int) -> tuple[str, ...]:
        devices = tuple(free[:n])
        del free[:n]
        return devices

    def ok(job: QueuedJob) -> Callable[[str], bool]:
        """Whether a device key may be given to ``job`` (rule 9)."""
        if not job.want:
            return lambda key: True
        return lambda key: key in known and job.want.matches(known[key])

    def fits(job: QueuedJob, devices: Sequence[str]) -> bool:
        """Whether every rank of ``job`` would fit on ``devices`` (node shape)."""
        by_node: dict[str, list[str]] = {}
        for key in dict.fromkeys(devices):
            by_node.setdefault(node_of(key) if node_of else "", []).append(key)
        workers = max(1, job.workers)
        return bool(choose_gang(by_node, job.gpus // workers, workers))

    def enough(job: QueuedJob, missing: int, victims: list[ActiveJob]) -> bool:
        """Whether the free GPUs, those arriving and the ``victims``' would start ``job``:
        ``missing`` GPUs short in count, and (on a cluster) in the shape its ranks need."""
        if missing > 0:
            return False
        if node_of is None:
            return True  # one host: a count is a shape
        usable = ok(job)
        around = [*free, *arriving_devices, *(d for v in victims for d in v.devices)]
        return fits(job, [d for d in around if usable(d)])

    def place(job: QueuedJob) -> tuple[str, ...] | None:
        """The devices of every rank of ``job`` from the free ones, taken; None if it does
        not fit now (in count or in shape)."""
        usable = ok(job)
        mine = [d for d in free if usable(d)] if job.want else free
        if job.gpus > len(mine):
            return None
        workers = max(1, job.workers)
        if node_of is None and workers == 1 and not job.want:
            return take(job.gpus)
        by_node: dict[str, list[str]] = {}
        for key in mine:
            by_node.setdefault(node_of(key) if node_of else "", []).append(key)
        ranks = choose_gang(by_node, job.gpus // workers, workers, spread=spread)
        if not ranks:
            return None
        chosen = [d for ds in ranks for d in ds]
        for d in chosen:
            free.remove(d)
        return tuple(chosen)

    def its_turn(job: QueuedJob) -> bool:
        """Whether fewer than its parallelism of its array's tasks are active (rule 8)."""
        return not job.array or array_active.get(job.array, 0) < max(1, job.parallelism)

    def taken(job: QueuedJob) -> None:
        if job.array:
            array_active[job.array] = array_active.get(job.array, 0) + 1

    for job in sorted(queued, key=queue_order):
        if not its_turn(job):
            continue
        used_g, used_j = gpus_used.get(job.owner, 0), jobs_used.get(job.owner, 0)
        q = quota(job.owner, job.groups)
        if job.kind != "job":
            q = Quota(gpus=q.gpus)
        # a notebook is no job, and a task of an array already counted adds no job
        new_job = 0 if job.kind != "job" or (job.array and job.array in counted) else 1
        if not q.allows(used_g, used_j - 1 + new_job, job.gpus):
            if job.preemptible:
                over_quota.append(job)
            continue
        devices = place(job) if job.gpus > 0 else ()
        if devices is not None:
            result.start.append(Placement(job.id, devices))
        else:
            # short in count, or (on a cluster) enough GPUs but not in the shape it needs
            usable = ok(job)
            mine = [d for d in free if usable(d)]
            missing = max(0, job.gpus - len(mine))
            if job.want:  # only the matching devices of the jobs on their way out count
                coming = sum(1 for d in arriving_devices if usable(d))
                arriving = min(coming, missing)
            else:
                arriving = min(incoming, missing)
            missing -= arriving
            chosen: list[ActiveJob] = []
            for victim in victims_left:
                if enough(job, missing, chosen):
                    break
                gives = sum(1 for d in victim.devices if usable(d)) if job.want else victim.gpus
                if gives == 0:
                    continue  # holds nothing this job could use: never preempted for it
                chosen.append(victim)
                missing -= gives
            if not enough(job, missing, chosen):
                continue  # preempting all borrowed GPUs would not be enough: wait, hold nothing
            if job.want:
                releasing = any(usable(d) for d in arriving_devices)
            else:
                releasing = any(a.releasing for a in active)
            if not chosen and not arriving and not releasing:
                continue  # nothing will come free for it: wait, hold nothing
            if not job.want:
                incoming -= arriving
            for victim in chosen:
                victims_left.remove(victim)
                result.preempt.append(victim.id)
            if job.want:  # held for this job until the victims are gone: what it can use
                for d in mine:
                    free.remove(d)
                result.held.extend(mine)
            else:
                result.held.extend(take(len(free)))
        gpus_used[job.owner] = used_g + job.gpus
        jobs_used[job.owner] = used_j + new_job
        if job.array:
            counted.add(job.array)
        taken(job)

    for job in over_quota:
        if not its_turn(job):
            continue
        devices = place(job) if job.gpus > 0 else ()
        if devices is not None:
            result.start.append(Placement(job.id, devices, over_quota=True))
            taken(job)
    return result
