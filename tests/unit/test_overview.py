"""What the service shows of a user's and everyone's workloads (gpulab.jobs.overview): a
user's billed minutes, their home, the job submission form's offer and the admin's overview,
read from real records on a SQLite file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gpulab.cuda import ImageBuild
from gpulab.db import Database
from gpulab.disk_ledger import DiskLedger
from gpulab.gpus.inventory import GpuDevice
from gpulab.gpus.ledger import GpuLedger
from gpulab.gpus.usage import DeviceUsage, keyed
from gpulab.jobs import overview
from gpulab.jobs.records import JobRecords
from gpulab.jobs.spec import DEFAULT_CPUS, DEFAULT_GPUS, DEFAULT_MEMORY, MAX_WORKERS
from gpulab.jobs.supervisor.context import JobContext
from gpulab.lifecycle import JobState, NotebookState
from gpulab.notebooks.records import NotebookRecords
from gpulab.settings import GpulabSettings

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime

J, N = JobState, NotebookState
RAN = [J.INITIALIZING, J.PENDING, J.RUNNING, J.FINALIZING, J.DONE]
SPEC = {"image": "img", "command": ["true"], "resources": {"gpus": 1}, "workers": 1}
#: what the engine's labels say of the default catalog's images (the rest: unlabelled)
BUILDS = {
    "gpulab/pytorch:2.13": ImageBuild("cuda", "12.8"),
    "gpulab/python:3.11": ImageBuild("cpu"),
}


class Engine(SimpleNamespace):
    """The runtime's part the overview reads: its inventory, its driver's CUDA and the
    catalog's image builds (each call recorded)."""

    async def image_builds(self, images):
        self.asked.append(sorted(images))
        return {i: BUILDS.get(i, ImageBuild()) for i in images}


def reading(readings) -> JobContext:
    """A supervisor's context whose runtime reads ``readings`` (node -> its devices'; a
    function that gives them, or raises; None: nothing can be read), as the pages read it."""
    rt = FakeRuntime()
    rt.gpu_readings = {} if readings is None else readings
    return JobContext(None, None, None, None, rt, None, Path("."))


class Lab:
    """Records, ledgers and a supervisor-shaped holder of them, on one database."""

    def __init__(self, tmp_path, readings=None):
        db = Database(f"sqlite:///{tmp_path / 'gpulab.sqlite'}")
        devices = [GpuDevice(str(i), "Test GPU", "16G") for i in range(3)]
        self.jobs = JobRecords(db, "t")
        self.notebooks = NotebookRecords(db, "t")
        self.settings = GpulabSettings(instance="t")
        self.sup = SimpleNamespace(
            s=self.settings,
            records=self.jobs,
            ledger=GpuLedger(db, "t", devices, sharing={"1": 4}),
            disk=DiskLedger(db, "t"),
            runtime=Engine(inventory="the inventory", driver_cuda="11.8", asked=[]),
            ctx=reading(None if readings is None else {"": readings}),
        )

    def job(self, owner: str, states=(), groups=()) -> str:
        job_id = self.jobs.create(owner, dict(SPEC), None, groups=groups)["id"]
        before = J.QUEUED
        for state in states:
            self.jobs.transition(job_id, state, expect=before)
            before = state
        return job_id

    def notebook(self, user: str, *states: NotebookState, server: str = "") -> None:
        for state in states:
            self.notebooks.transition(user, server, state)


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp_path)


def test_a_users_usage_is_their_jobs_and_notebooks_billed_minutes(lab):
    assert overview.usage_of(lab.jobs, lab.notebooks, "ann") == {
        "user": "ann",
        "jobs_billed_minutes": 0,
        "notebooks_billed_minutes": 0,
        "billed_minutes": 0,
    }
    lab.job("ann", RAN)
    lab.job("ann", RAN)
    lab.job("ann")  # queued: never billed
    lab.job("bob", RAN)
    lab.notebook("ann", N.STARTING, N.RUNNING, N.STOPPING, N.STOPPED)
    got = overview.usage_of(lab.jobs, lab.notebooks, "ann")
    # each ran less than a minute: one commenced minute each
    assert got == {
        "user": "ann",
        "jobs_billed_minutes": 2,
        "notebooks_billed_minutes": 1,
        "billed_minutes": 3,
    }
    # what the records' own readers say, added by billing's rule
    assert got["jobs_billed_minutes"] == lab.jobs.usage("ann")["jobs_billed_minutes"]
    assert got["notebooks_billed_minutes"] == lab.notebooks.billed_minutes("ann")


def test_the_admins_overview_of_gpus_workloads_and_users(tmp_path):
    readings = [DeviceUsage("0", 42, 3 * 1024**3, 16 * 1024**3)]
    lab = Lab(tmp_path, readings)
    queued = lab.job("ann", groups=("team",))
    running = lab.job("ann", [J.INITIALIZING, J.PENDING, J.RUNNING], groups=("team",))
    done = lab.job("bob", RAN)
    lab.notebook("ann", N.STARTING, N.RUNNING)
    lab.notebook("cy", N.STARTING, N.RUNNING, N.STOPPING, N.STOPPED, server="lab")
    ledger = lab.sup.ledger
    ledger.reserve(f"t/job/{running}", "ann", "job", 1)
    ledger.reserve("t/notebook/ann/", "ann", "notebook", 0.5)
    ledger.reserve(f"t/job/{done}-gone", "bob", "job", 1)  # a job no longer listed
    lab.sup.disk.book("ann", "t/job/x", "vol", "", 3 * 1024**3, None)

    got = run_async(overview.admin_overview(lab.sup, lab.settings, lab.notebooks))

    assert (got["gpus_total"], got["gpus_busy"], got["inventory"]) == (3, 3, "the inventory")
    assert [j["id"] for j in got["jobs"]] == [done, running, queued]  # newest first
    assert got["jobs_total"] == 3
    assert sorted((n["user"], n["state"]) for n in got["notebooks"]) == [
        ("ann", "RUNNING"),
        ("cy", "STOPPED"),
    ]
    assert got["default_limits"] == lab.settings.limits_for("", [])

    gpus = {g["device"]["id"]: g for g in got["gpus"]}
    assert gpus["0"]["activity"] == {
        "utilization": 42,
        "memory_used": "3.0 GiB",
        "memory_total": "16.0 GiB",
    }
    assert gpus["1"]["activity"] is None  # not read
    held = {h["workload"]: h for g in got["gpus"] for h in g["held"]}
    assert held[f"t/job/{running}"]["job_id"] == running
    assert held[f"t/job/{running}"]["notebook"] is None
    assert held[f"t/job/{done}-gone"]["job_id"] is None  # no page to link to
    assert held["t/notebook/ann/"]["notebook"] == "ann/"
    assert (held["t/notebook/ann/"]["slots"], held["t/notebook/ann/"]["fraction"]) == (
        [1, 2],
        0.5,
    )
    assert (gpus["1"]["slots"], gpus["1"]["used"]) == (4, 2)

    users = {u["name"]: u for u in got["users"]}
    assert list(users) == ["ann", "bob", "cy"]
    ann = users["ann"]
    assert ann["groups"] == ["team"]
    assert (ann["notebooks"], ann["notebooks_running"]) == (1, 1)
    assert (ann["jobs"], ann["jobs_active"], ann["jobs_queued"]) == (2, 1, 1)
    assert ann["gpus_held"] == 1.5  # a whole GPU and half a shared one
    assert (ann["disk_held"], ann["disk_quota"]) == ("3.0 GiB", "200.0 GiB")  # the default
    assert ann["usage"] == overview.usage_of(lab.jobs, lab.notebooks, "ann")
    assert ann["limits"] == lab.settings.limits_for("ann", ["team"])
    assert ann["quota"] == lab.settings.quota_for("ann", ["team"])
    assert users["bob"]["usage"]["jobs_billed_minutes"] == 1
    assert got["month_report"] == overview.month_usage(lab.jobs, None, None)
    assert [r["user"] for r in got["month_report"]["users"]] == ["ann", "bob"]  # ann runs
    assert (users["cy"]["jobs"], users["cy"]["notebooks_running"]) == (0, 0)

    # the catalog's images, their builds judged against the driver (image_rows)
    catalog = lab.settings.catalog
    assert lab.sup.runtime.asked == [sorted(catalog.images())]
    images = {i["image"]: i for i in got["images"]}
    assert got["images"] == overview.image_rows(catalog, BUILDS, "11.8")
    assert [i["image"] for i in got["images"]] == [
        v.image for f in catalog.frameworks.values() for v in f.versions
    ]
    assert images["gpulab/pytorch:2.13"]["refused"].startswith(
        "image gpulab/pytorch:2.13 needs CUDA 12.8, newer than CUDA 11.8"
    )
    assert images["gpulab/python:3.11"]["flavour"] == "CPU"
    assert images["gpulab/python:3.11"]["refused"] == images["gpulab/jax:0.7"]["refused"] == ""


def test_the_users_table_counts_what_it_is_handed():
    settings = GpulabSettings(instance="t", disk_quota="1G", user_disk_quotas={"cy": None})
    jobs = {  # as JobRecords.owner_rows counts them
        "ann": {"jobs": 2, "jobs_active": 1, "jobs_queued": 1, "groups": ["new"]},
        "bob": {"jobs": 1, "jobs_active": 0, "jobs_queued": 0, "groups": []},
    }
    notebooks = {"cy": {"notebooks": 2, "notebooks_running": 1}}
    allocations = [{"owner": "cy", "gpus": 0.25}, {"owner": "cy", "gpus": 0.25}]
    bookings = [{"owner": "bob", "bytes": 512}, {"owner": "bob", "bytes": 512}]
    usage = {n: f"usage of {n}" for n in ("ann", "bob", "cy")}
    rows = overview.user_rows(
        settings, ["ann", "bob", "cy"], jobs, notebooks, allocations, bookings, usage
    )
    got = {
        r["name"]: (
            r["groups"],
            r["jobs"],
            r["jobs_active"],
            r["jobs_queued"],
            r["notebooks"],
            r["notebooks_running"],
            r["gpus_held"],
            r["disk_held"],
            r["disk_quota"],
            r["usage"],
        )
        for r in rows
    }
    assert got == {
        "ann": (["new"], 2, 1, 1, 0, 0, 0, "0 B", "1.0 GiB", "usage of ann"),
        "bob": ([], 1, 0, 0, 0, 0, 0, "1.0 KiB", "1.0 GiB", "usage of bob"),
        "cy": ([], 0, 0, 0, 2, 1, 0.5, "0 B", "∞", "usage of cy"),  # no quota
    }
    assert [r["name"] for r in rows] == ["ann", "bob", "cy"]  # the page's order


def test_the_admins_users_come_a_page_at_a_time(lab, monkeypatch):
    """The admin page's users: a page by name, from jobs' owners and notebooks' users, the
    next one after the last name; walked to the end, every user once."""
    for name in ("dan", "ann", "eve", "bob"):
        lab.job(name)
    lab.notebook("cy", N.STARTING)
    lab.notebook("ann", N.STARTING)
    pages, after = [], ""
    while after is not None:
        names, after = overview.users_page(lab.jobs, lab.notebooks, after, 2)
        pages.append(names)
    assert pages == [["ann", "bob"], ["cy", "dan"], ["eve"]]
    got = run_async(overview.admin_overview(lab.sup, lab.settings, lab.notebooks, users_after="cy"))
    assert [u["name"] for u in got["users"]] == ["dan", "eve"]
    assert (got["users_after"], got["users_next"]) == ("cy", None)
    html = admin_html(lab, got)
    assert 'data-user="dan"' in html and 'data-user="ann"' not in html
    assert 'id="users-next"' not in html and "after cy" in html  # the last page
    monkeypatch.setattr(overview, "ADMIN_PAGE", 1)  # a page of one user, of one notebook
    got = run_async(overview.admin_overview(lab.sup, lab.settings, lab.notebooks))
    assert [u["name"] for u in got["users"]] == ["ann"] and got["users_next"] == "ann"
    assert [(n["user"], n["server"]) for n in got["notebooks"]] == [("ann", "")]
    assert got["notebooks_next"] == ("ann", "")
    assert got["job_counts"] == {"QUEUED": 4} and got["jobs_total"] == 4
    html = admin_html(lab, got)
    assert 'href="/p/admin?users_after=ann#users"' in html
    assert 'href="/p/admin?nb_user=ann&amp;nb_server=#all-notebooks"' in html
    assert "4 QUEUED" in html
    got = run_async(
        overview.admin_overview(lab.sup, lab.settings, lab.notebooks, notebooks_after=("ann", ""))
    )
    assert [(n["user"], n["server"]) for n in got["notebooks"]] == [("cy", "")]
    assert got["notebooks_next"] is None


def test_the_admins_users_are_reused_until_a_job_changes_or_5_s_pass(lab, monkeypatch):
    """The table of users is read again once a job of this process changed state, or once
    USERS_MAX_AGE passed (what another process changed: a notebook); never the same objects
    twice (a reader's edits do not reach the next)."""
    clock = [1000.0]
    monkeypatch.setattr(overview.time, "monotonic", lambda: clock[0])
    job = lab.job("ann")

    def users() -> dict:
        got = run_async(overview.admin_overview(lab.sup, lab.settings, lab.notebooks))
        return {u["name"]: (u["jobs_active"], u["notebooks"]) for u in got["users"]}

    first = run_async(overview.admin_overview(lab.sup, lab.settings, lab.notebooks))["users"]
    first[0]["name"] = "edited by a reader"
    assert users() == {"ann": (0, 0)}
    lab.notebook("bob", N.STARTING)  # as the hub's process writes it: not seen yet
    clock[0] += overview.USERS_MAX_AGE - 1
    assert users() == {"ann": (0, 0)}
    clock[0] += 1  # its age is up
    assert users() == {"ann": (0, 0), "bob": (0, 1)}
    lab.jobs.transition(job, J.INITIALIZING, expect=J.QUEUED)  # a job of this process
    assert users() == {"ann": (1, 0), "bob": (0, 1)}


def admin_html(lab: Lab, overview_data: dict) -> str:
    """The admin page as the service renders it (its template, this data)."""
    from gpulab.resources import format_memory
    from gpulab.service.pages.base import _env

    base = {"me": {"name": "root"}, "is_admin": True, "prefix": "/p/", "hub": "/hub/"}
    base |= {"users_prefix": "/user/", "static": "/s/", "xsrf_token": "x", "request_path": "/"}
    base["xsrf_form_html"] = lambda: ""
    return _env.get_template("admin.html").render(
        **base, **overview_data, settings=lab.settings, format_memory=format_memory
    )


def test_a_users_home(lab):
    older = lab.job("ann", RAN)
    for _ in range(5):
        lab.job("ann")
    newest = lab.job("ann", [J.INITIALIZING])
    lab.job("bob")
    lab.notebook("ann", N.STARTING, N.RUNNING)
    lab.notebook("bob", N.STARTING)
    lab.sup.ledger.reserve("t/notebook/ann/", "ann", "notebook", 0.5)
    home = overview.home_overview(lab.sup, lab.notebooks, "ann", with_notebooks=True)
    assert [n["user"] for n in home["notebooks"]] == ["ann"]
    assert len(home["recent_jobs"]) == overview.HOME_JOBS == 5
    assert home["recent_jobs"][0]["id"] == newest
    assert older not in {j["id"] for j in home["recent_jobs"]}
    assert home["jobs_total"] == 7
    assert home["job_counts"] == {"DONE": 1, "QUEUED": 5, "INITIALIZING": 1}
    share = home["usage"].pop("fair_share")
    assert home["usage"] == overview.usage_of(lab.jobs, lab.notebooks, "ann")
    # no GPU-hours recorded yet: a factor of 1, no group; ann's five queued jobs are the
    # first five in line (bob's came last), in the order they were submitted
    assert share["factor"] == 1.0 and share["gpu_hours"] == 0 and share["group"] is None
    assert [p["place"] for p in share["queued"]] == [1, 2, 3, 4, 5]
    assert (share["queued_mine"], share["queued_total"]) == (5, 6)
    # GPU 1 is shared in quarters: half of it is held; 0 and 2 are free
    assert (home["gpus_free"], home["gpus_total"]) == (2, 3)
    assert home["shared"] == {"1": (2, 4)}
    # a caller who may not read notebooks sees none
    assert (
        overview.home_overview(lab.sup, lab.notebooks, "ann", with_notebooks=False)["notebooks"]
        == []
    )


def test_a_home_shows_what_it_can_when_the_ledger_cannot_be_read(lab):
    def broken():
        raise RuntimeError("no database")

    lab.sup.ledger.free_count = broken
    lab.sup.ledger.shared_free = broken
    home = overview.home_overview(lab.sup, lab.notebooks, "ann", with_notebooks=True)
    assert (home["gpus_free"], home["gpus_total"], home["shared"]) == (None, 3, {})


def test_what_the_submit_form_offers_a_user(tmp_path):
    lab = Lab(tmp_path)
    lab.settings = GpulabSettings(
        instance="t", user_max_resources={"ann": {"cpus": 4, "memory": "8G", "gpus": 3}}
    )
    lab.sup.ledger.reserve("t/notebook/bob/", "bob", "notebook", 1)
    got = run_async(overview.submit_form(lab.sup, lab.settings, "ann", ["team"]))
    catalog = lab.settings.catalog
    assert got["catalog"] is catalog
    assert lab.sup.runtime.asked == [sorted(catalog.images())]
    assert got["builds"] == {i: BUILDS.get(i, ImageBuild()) for i in catalog.images()}
    assert got["default_env"] == "python/3.11"  # the default framework's default version
    assert got["flavors"] == list(lab.settings.flavor_map.values())
    assert got["limits"] == lab.settings.limits_for("ann", ["team"])
    assert (got["limits"].gpus, got["limit_memory"]) == (3, "8G")
    assert (got["gpus_free"], got["gpus_total"]) == (2, 3)
    assert got["defaults"] == {"cpus": DEFAULT_CPUS, "memory": DEFAULT_MEMORY, "gpus": DEFAULT_GPUS}
    assert (got["max_workers"], got["max_timeout"]) == (MAX_WORKERS, lab.settings.job_max_timeout)


def test_the_submit_form_renders_when_the_ledger_cannot_be_read(lab):
    def broken():
        raise RuntimeError("no database")

    lab.sup.ledger.free_count = broken
    got = run_async(overview.submit_form(lab.sup, lab.settings, "ann", []))
    assert (got["gpus_free"], got["gpus_total"]) == (None, 3)
    assert got["limits"] == lab.settings.limits_for("ann", [])


GIB = 1024**3


def job_on(state: str, *workers: tuple[str, list[str]]) -> dict:
    """A job's record as the API answers it: its state and each worker's (node, devices)."""
    ws = [{"rank": k, "node": n, "devices": d} for k, (n, d) in enumerate(workers)]
    return {"state": state, "devices": [d for w in ws for d in w["devices"]], "workers": ws}


READINGS = [
    DeviceUsage("0", 93, 20 * GIB, 80 * GIB, "GPU-aaa"),
    DeviceUsage("1", 5, 1 * GIB, 80 * GIB, "GPU-bbb"),
    DeviceUsage("MIG-ccc", None, 2 * GIB, 10 * GIB),
]


def test_a_running_jobs_gpus_now_each_device_it_holds_by_rank():
    rows = overview.gpu_usage_rows(job_on("RUNNING", ("", ["1"]), ("", ["0", "GPU-bbb"])), READINGS)
    assert rows == [
        {"rank": 0, "device": "1", "utilization": 5, "memory_used": GIB, "memory_total": 80 * GIB},
        {
            "rank": 1,
            "device": "0",
            "utilization": 93,
            "memory_used": 20 * GIB,
            "memory_total": 80 * GIB,
        },
        # a GPU booked by its UUID is read by it too
        {
            "rank": 1,
            "device": "GPU-bbb",
            "utilization": 5,
            "memory_used": GIB,
            "memory_total": 80 * GIB,
        },
    ]


def test_a_mig_device_shows_its_memory_and_no_utilization():
    rows = overview.gpu_usage_rows(job_on("RUNNING", ("", ["MIG-ccc"])), READINGS)
    assert rows == [
        {
            "rank": 0,
            "device": "MIG-ccc",
            "utilization": None,
            "memory_used": 2 * GIB,
            "memory_total": 10 * GIB,
        }
    ]


@pytest.mark.parametrize(
    "job, readings",
    [
        (job_on("QUEUED", ("", [])), READINGS),  # holds nothing yet
        (job_on("FINALIZING", ("", ["0"])), READINGS),  # not RUNNING: what it did, not does
        (job_on("RUNNING", ("", [])), READINGS),  # a CPU job
        (job_on("RUNNING", ("", ["0"])), []),  # nothing read (no NVML)
        (job_on("RUNNING", ("", ["7"])), READINGS),  # its device not among those read
        (job_on("RUNNING", ("gpu-1", ["gpu-1/0"])), READINGS),  # a Swarm node's: not this host's
        # a Swarm node's "0" is not another node's "0"
        (job_on("RUNNING", ("gpu-1", ["gpu-1/0"])), keyed({"gpu-2": READINGS})),
    ],
)
def test_nothing_is_shown_where_the_jobs_gpus_are_not_read_here(job, readings):
    assert overview.gpu_usage_rows(job, readings) == []


def with_usage(sup, job: dict) -> dict:
    return run_async(overview.with_gpu_usage(sup, job))


def test_with_gpu_usage_reads_through_the_services_reader_only_for_a_running_gpu_job():
    calls = []

    def reader():
        calls.append(1)
        return {"": READINGS}

    def sup(read):
        return SimpleNamespace(ctx=reading(read))

    running = job_on("RUNNING", ("", ["0"]))
    got = with_usage(sup(reader), running)
    assert got == {**running, "gpu_usage": overview.gpu_usage_rows(running, READINGS)}
    assert got["gpu_usage"][0]["utilization"] == 93 and "gpu_usage" not in running
    assert calls == [1]
    # a job not running, or with no GPU, is not read at all
    assert with_usage(sup(reader), job_on("QUEUED", ("", [])))["gpu_usage"] == []
    assert with_usage(sup(reader), job_on("RUNNING", ("", [])))["gpu_usage"] == []
    assert calls == [1]
    # nothing read (no NVML, a Swarm node without a fresh reading), or a reader that fails:
    # nothing, never an error
    assert with_usage(sup(None), running)["gpu_usage"] == []

    def broken():
        raise RuntimeError("NVML went away")

    assert with_usage(sup(broken), running)["gpu_usage"] == []


def test_a_swarm_jobs_gpus_now_from_its_nodes_readings():
    """On a Swarm each rank's devices are read on its node (the agents' readings, node ->
    devices): a row per device read; a node without a reading (stale, missing) has none."""
    readings = {
        "gpu-1": [DeviceUsage("0", 71, 4 * GIB, 80 * GIB, "GPU-aaa")],
        "gpu-2": [DeviceUsage("0", 0, 0, 80 * GIB, "GPU-bbb")],
    }
    job = job_on(
        "RUNNING", ("gpu-1", ["gpu-1/0"]), ("gpu-2", ["gpu-2/GPU-bbb"]), ("gpu-3", ["gpu-3/0"])
    )
    got = with_usage(SimpleNamespace(ctx=reading(readings)), job)["gpu_usage"]
    assert got == [
        {
            "rank": 0,
            "device": "gpu-1/0",
            "utilization": 71,
            "memory_used": 4 * GIB,
            "memory_total": 80 * GIB,
        },
        {
            "rank": 1,
            "device": "gpu-2/GPU-bbb",
            "utilization": 0,
            "memory_used": 0,
            "memory_total": 80 * GIB,
        },
    ]
