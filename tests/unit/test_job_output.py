"""A reader's request for a job's output (gpulab.jobs.output), on the fake Runtime: the rank
asked for and the caps first, then the job's workloads while they exist (waited for when
following a job that is starting), else what was saved at its end."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gpulab.jobs import output
from gpulab.jobs.output import JobOutput
from gpulab.jobs.refusals import Busy, Invalid, NotFound
from gpulab.runtime.base import WorkloadSpec

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime, FakeWorkload

R0 = b"2026-11-23T10:00:00Z one\n2026-11-23T10:00:02Z three\n"
R1 = b"2026-11-23T10:00:01Z two\n"


class _Records:
    """A job's record as the output rules read it: its state, asked for each time."""

    def __init__(self, *states: str | None):
        self.states = list(states)
        self.reads = 0

    def get(self, job_id, history=True):
        state = self.states[min(self.reads, len(self.states) - 1)]
        self.reads += 1
        return None if state is None else {"id": job_id, "state": state}


def _sup(tmp_path, *states: str | None, **logs: bytes) -> SimpleNamespace:
    rt = FakeRuntime()
    for name, out in logs.items():
        _add(rt, name, out)
    return SimpleNamespace(
        runtime=rt,
        records=_Records(*(states or ("RUNNING",))),
        container_name=lambda job_id: f"c-{job_id}",
        log_file=lambda job_id, rank=None: (
            tmp_path / (f"{job_id}.log" if rank is None else f"{job_id}.r{rank}.log")
        ),
    )


def _add(rt: FakeRuntime, name: str, out: bytes = b"") -> None:
    rt.workloads[name.replace("_", "-")] = FakeWorkload(
        WorkloadSpec(name=name.replace("_", "-"), image="i", command=[]), logs=out
    )


def _job(workers: int = 1) -> dict:
    return {"id": "j1", "state": "RUNNING", "spec": {"workers": workers}}


async def _blocking(read):
    return await asyncio.to_thread(read)


async def _read(sup, job, rank=None, follow=False, gone=lambda: False, user="ann"):
    async with output.read(sup, job, rank, user, follow, gone, _blocking) as found:
        assert output.STREAMS.open  # held while the block lasts
        return found


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch):
    monkeypatch.setattr(output, "WAIT_POLL", 0)
    yield
    assert output.STREAMS.open == {}  # every stream given back


def test_a_running_jobs_workload_is_read_live(tmp_path):
    sup = _sup(tmp_path, c_j1=b"hi\n")
    assert run_async(_read(sup, _job())) == JobOutput(live=(("", "c-j1"),))
    # a one-worker job's rank 0 is the job itself
    assert run_async(_read(sup, _job(), rank="0")) == JobOutput(live=(("", "c-j1"),))


def test_every_rank_merged_or_followed_line_by_line(tmp_path):
    sup = _sup(tmp_path, c_j1=R0, c_j1_r1=R1)
    merged = JobOutput(whole=b"[rank 0] one\n[rank 1] two\n[rank 0] three\n")
    assert run_async(_read(sup, _job(2))) == merged
    followed = run_async(_read(sup, _job(2), follow=True))
    assert followed == JobOutput(live=(("[rank 0] ", "c-j1"), ("[rank 1] ", "c-j1-r1")))
    assert run_async(_read(sup, _job(2), rank="1")) == JobOutput(live=(("", "c-j1-r1"),))


def test_an_ended_jobs_output_is_what_was_saved(tmp_path):
    sup = _sup(tmp_path, "DONE")
    assert run_async(_read(sup, _job(2), follow=True)) == JobOutput()  # nothing saved
    (tmp_path / "j1.log").write_bytes(b"[rank 0] one\n[rank 1] two\n")
    (tmp_path / "j1.r1.log").write_bytes(R1)
    assert run_async(_read(sup, _job(2))).whole == b"[rank 0] one\n[rank 1] two\n"
    # one rank's saved log without the engine's timestamps
    assert run_async(_read(sup, _job(2), rank="1", follow=True)).whole == b"two\n"
    # one rank of the ranks gone: the saved log too
    _add(sup.runtime, "c-j1", R0)
    assert run_async(_read(sup, _job(2))).whole == b"[rank 0] one\n[rank 1] two\n"
    (tmp_path / "j1.log").write_bytes(b"done\n")
    assert run_async(_read(_sup(tmp_path, "DONE"), _job())).whole == b"done\n"


def test_a_follower_waits_for_a_starting_job_until_it_runs_ends_or_the_reader_goes(tmp_path):
    sup = _sup(tmp_path, "QUEUED", "INITIALIZING", "PENDING")
    seen = []

    def gone():  # the workload appears while the job is PENDING (the third look)
        seen.append(len(seen))
        if len(seen) == 3:
            _add(sup.runtime, "c-j1")
        return False

    found = run_async(_read(sup, _job(), follow=True, gone=gone))
    assert found == JobOutput(live=(("", "c-j1"),)) and sup.records.reads == 3

    sup = _sup(tmp_path, "QUEUED", "RUNNING")  # ran and ended between two looks: saved
    (tmp_path / "j1.log").write_bytes(b"quick\n")
    assert run_async(_read(sup, _job(), follow=True)) == JobOutput(whole=b"quick\n")
    sup = _sup(tmp_path, None)  # deleted meanwhile
    assert run_async(_read(sup, _job(), follow=True)) == JobOutput(whole=b"quick\n")

    sup = _sup(tmp_path, "QUEUED")
    assert run_async(_read(sup, _job(), follow=True, gone=lambda: True)) is None
    # not following, a queued job answers at once
    assert run_async(_read(_sup(tmp_path, "QUEUED"), _job())) == JobOutput(whole=b"quick\n")


def test_the_rank_is_checked_before_the_caps(tmp_path):
    sup = _sup(tmp_path, c_j1=b"")
    with pytest.raises(Invalid) as e:
        run_async(_read(sup, _job(2), rank="x"))
    assert e.value.field == "rank"
    with pytest.raises(NotFound, match="job j1 has no rank 2: it has 2 workers"):
        run_async(_read(sup, _job(2), rank="2"))

    async def over_the_cap():
        with output.STREAMS.held("ann", 1, None, True):
            async with output.read(sup, _job(8), None, "ann", True, lambda: False, _blocking):
                pass

    with pytest.raises(Busy, match="following all 8 ranks takes 8"):
        run_async(over_the_cap())
    # a rank the job lacks, even over the cap
    with pytest.raises(NotFound), output.STREAMS.held("ann", 8, None, True):
        run_async(_read(sup, _job(2), rank="5"))


@pytest.mark.parametrize(
    ("workers", "state", "first"),
    [
        (1, "RUNNING", None),  # a job's one output
        (4, "RUNNING", None),  # 4 streams: half of a user's 8
        (5, "RUNNING", 0),  # more: rank 0 only at first
        (8, "QUEUED", 0),
        (8, "DONE", None),  # ended: its saved output, no stream held
        (64, "FAILED", None),
        (64, "FINALIZING", 0),
    ],
)
def test_a_jobs_page_follows_every_rank_at_first_while_that_stays_within_half_the_cap(
    workers, state, first
):
    job = {"id": "j1", "state": state, "spec": {"workers": workers}}
    assert output.first_rank(job) == first
