"""The hang rule (jobs/hang.py) as a table: GPU busy / idle / unread x output x CPU, then what
the supervisor does with a quiet job over time."""

from __future__ import annotations

import itertools

import pytest

from gpulab.jobs.hang import (
    GPU_BUSY_PERCENT,
    HANG_CPU_SHARE,
    MAX_HANG_RESTARTS,
    Signs,
    Verdict,
    failure_message,
    judge,
    progressed,
    restart_note,
)

PERIOD = 60.0
#: CPU time (ns) over a period: clearly above the threshold, and a restart's few ms
CPU = {"busy": int(2 * HANG_CPU_SHARE * PERIOD * 1e9), "idle": 5_000_000}
GPU = {"busy": 87, "barely": GPU_BUSY_PERCENT, "idle": 0, "unread": None}
OUTPUT = {"output": True, "silent": False}


@pytest.mark.parametrize(
    "gpu, output, cpu", list(itertools.product(GPU, OUTPUT, CPU)), ids="-".join
)
def test_any_sign_of_life_is_progress(gpu, output, cpu):
    signs = Signs(output=OUTPUT[output], cpu_ns=CPU[cpu], gpu_percent=GPU[gpu])
    alive = gpu in ("busy", "barely") or output == "output" or cpu == "busy"
    assert progressed(signs, PERIOD) is alive
    # quiet for longer than the period: a hang exactly when there was no sign at all
    verdict = judge(signs, PERIOD, quiet_for=PERIOD + 1, restarts_in_a_row=0)
    assert verdict is (Verdict.PROGRESS if alive else Verdict.RESTART)


QUIET = Signs(output=False, cpu_ns=0, gpu_percent=0)


@pytest.mark.parametrize(
    "quiet_for, restarts, verdict",
    [
        (0.0, 0, Verdict.WAIT),
        (PERIOD, 0, Verdict.WAIT),  # a whole period, not yet more
        (PERIOD + 0.1, 0, Verdict.RESTART),
        (PERIOD + 0.1, MAX_HANG_RESTARTS - 1, Verdict.RESTART),
        (PERIOD + 0.1, MAX_HANG_RESTARTS, Verdict.FAIL),
        (10 * PERIOD, MAX_HANG_RESTARTS, Verdict.FAIL),
    ],
)
def test_a_quiet_job_waits_then_restarts_then_fails(quiet_for, restarts, verdict):
    assert judge(QUIET, PERIOD, quiet_for, restarts) is verdict


def test_a_busy_gpu_is_never_a_hang_however_long_and_however_often():
    busy = Signs(output=False, cpu_ns=0, gpu_percent=100)
    assert judge(busy, PERIOD, 1e9, MAX_HANG_RESTARTS) is Verdict.PROGRESS


def test_what_the_events_say():
    assert restart_note(60, True, 1, 1) == (
        "no output, no CPU progress and no GPU activity for 60 s: "
        "command restarted in place (1 of 3)"
    )
    assert restart_note(0.5, False, 2, 4) == (
        "no output and no CPU progress for 0.5 s: command restarted in place in all 4 "
        "workers (2 of 3)"
    )
    assert failure_message(30) == "no progress for 30 s after 3 restarts in place"
