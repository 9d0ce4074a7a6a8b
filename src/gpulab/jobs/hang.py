"""Is a job hung? The rule of "restart upon hang", as data (pure: values in, values out).

At each look the supervisor gathers the job's signs of life since its last look (over all its
workers): new output from the command, the CPU time it used since its last sign of progress,
and how busy its GPUs are now (NVML's utilization, sampled at every look; None where it
cannot be read: no GPU booked, no NVML, a MIG device, a Swarm node whose GPU agent has no
fresh reading). Any one of them is progress. A job with none for a whole hang period is
hung: its command is restarted in place, at most :data:`MAX_HANG_RESTARTS` times in a row,
then the job fails.

A GPU counts as busy from :data:`GPU_BUSY_PERCENT` of utilization: any kernel that ran during
NVML's sample period. A job that keeps a kernel running (a silent GPU-bound phase, or a
collective that spins on the GPU) is never restarted as hung; one whose GPUs, output and CPU
are all idle for the period is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..idle import GPU_BUSY_PERCENT

MAX_HANG_RESTARTS = 3
#: less CPU than this share of one core over a hang period counts as "no CPU progress"
HANG_CPU_SHARE = 0.01


@dataclass(frozen=True)
class Signs:
    """A job's signs of life at one look."""

    #: the command wrote output since the last look (the runner's own notes excluded)
    output: bool
    #: CPU time (ns) its workers used since its last sign of progress (or restart)
    cpu_ns: int
    #: the highest utilization (percent) of its GPUs now; None: not read
    gpu_percent: int | None = None


class Verdict(enum.Enum):
    PROGRESS = "progress"  # a sign of life: the hang clock starts again
    WAIT = "wait"  # no sign yet, but not for a whole period
    RESTART = "restart"  # hung: restart the command in place
    FAIL = "fail"  # hung again after MAX_HANG_RESTARTS restarts in a row: the job fails


def gpu_busy(percent: int | None) -> bool:
    return percent is not None and percent >= GPU_BUSY_PERCENT


def cpu_busy(cpu_ns: int, period: float) -> bool:
    """More CPU than :data:`HANG_CPU_SHARE` of one core over ``period`` seconds (a restart's
    own few milliseconds are not progress)."""
    return cpu_ns > HANG_CPU_SHARE * period * 1e9


def progressed(signs: Signs, period: float) -> bool:
    """Output, CPU work or a busy GPU: any one is progress."""
    return signs.output or cpu_busy(signs.cpu_ns, period) or gpu_busy(signs.gpu_percent)


def judge(signs: Signs, period: float, quiet_for: float, restarts_in_a_row: int) -> Verdict:
    """What to do at one look: ``quiet_for`` seconds since the last sign of progress (or the
    last restart), ``restarts_in_a_row`` hang restarts with no progress between them."""
    if progressed(signs, period):
        return Verdict.PROGRESS
    if quiet_for <= period:
        return Verdict.WAIT
    return Verdict.FAIL if restarts_in_a_row >= MAX_HANG_RESTARTS else Verdict.RESTART


def restart_note(period: float, gpus_read: bool, restart: int, workers: int) -> str:
    """The fault-recovery event of the ``restart``-th hang restart in a row."""
    idle = (
        "no output, no CPU progress and no GPU activity"
        if gpus_read
        else ("no output and no CPU progress")
    )
    where = "" if workers == 1 else f" in all {workers} workers"
    return (
        f"{idle} for {period:g} s: command restarted in place{where} "
        f"({restart} of {MAX_HANG_RESTARTS})"
    )


def failure_message(period: float) -> str:
    return f"no progress for {period:g} s after {MAX_HANG_RESTARTS} restarts in place"
