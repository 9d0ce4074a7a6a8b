"""A job's output as users read it (gpulab.jobs.logs): the tail kept, the ranks' tails merged,
and the cap on the log streams open at once."""

from __future__ import annotations

import pytest

from gpulab.jobs.logs import LogStreams, merged_tail, read_tail
from gpulab.jobs.refusals import Busy
from gpulab.runtime.base import WorkloadGone, WorkloadSpec

from ..support.fake_runtime import FakeRuntime, FakeWorkload


def _engine(**logs: bytes) -> FakeRuntime:
    rt = FakeRuntime()
    for name, out in logs.items():
        rt.workloads[name] = FakeWorkload(WorkloadSpec(name=name, image="i", command=[]), logs=out)
    return rt


def test_the_tail_is_whole_lines_within_what_is_kept():
    rt = _engine(a=b"".join(b"line %d\n" % i for i in range(1000)))
    tail = read_tail(rt, "a", 100)
    assert len(tail) <= 100 and tail.endswith(b"line 999\n")
    assert tail.startswith(b"line ")  # no half line at its start
    with pytest.raises(WorkloadGone):
        read_tail(rt, "gone", 100)


def test_every_ranks_tail_merged_in_time_order():
    rt = _engine(
        r0=b"2026-11-23T10:00:00Z one\n2026-11-23T10:00:02Z three\n",
        r1=b"2026-11-23T10:00:01Z two\n",
    )
    assert merged_tail(rt, ["r0", "r1"]) == (b"[rank 0] one\n[rank 1] two\n[rank 0] three\n")


def test_streams_are_capped_per_user_and_in_all():
    streams = LogStreams(per_user=3, total=4)
    with streams.held("ann", 1, None, True), streams.held("ann", 1, None, False):
        # a distributed job's ranks followed together take one stream each
        with pytest.raises(Busy) as e, streams.held("ann", 2, None, True):
            pass
        assert e.value.status == 429
        assert e.value.message == (
            "you have 2 of 3 job log streams open; close one first (following all 2 ranks "
            "takes 2: follow one with ?rank=K, or gpulab job logs --rank K)"
        )
        with (
            streams.held("ann", 2, 1, True),
            streams.held("bob", 1, None, True),
            pytest.raises(Busy, match="the service has 4 log streams open"),
            streams.held("cid", 1, None, True),
        ):
            pass
    assert streams.open == {}  # every stream given back, refused ones never counted
