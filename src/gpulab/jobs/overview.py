"""What the service shows of a user's, or everyone's, workloads: a user's billed minutes (the
usage API, the home page and the admin's table alike: :func:`usage_of`), a user's home
(:func:`home_overview`: their notebooks, recent jobs, billed minutes and the free GPUs), what a
running job's GPUs do now (its page and ``GET /api/jobs/{id}`` alike: :func:`with_gpu_usage`)
and the admin's overview of the platform (:func:`admin_overview`): every GPU and what holds
it, every notebook and job, each user's limits, quotas, GPUs, disk and billed minutes, and the
catalog's images with whether GPU workloads may use them on this host's driver; and what the
job submission form offers a user (:func:`submit_form`).

Here because the jobs' supervisor holds what both domains book (the GPU ledger, the disk
bookings, this host's GPU readings); the notebooks' records are handed in
(:class:`NotebookReads`: the domains never import each other). The rules read here are their
owners': what is billed (:mod:`gpulab.billing`), a shared GPU's fractions
(:meth:`gpulab.gpus.ledger.GpuLedger.holdings`), the quotas and limits (the settings), the
CUDA rule (:func:`gpulab.cuda.cuda_refusal`). Blocking: each function but the coroutines
reads the database (run them off the event loop); the coroutines read it on a worker thread.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Protocol

from ..billing import month_of, parse_month, user_usage
from ..cuda import ImageBuild, cuda_refusal, cuda_shortfall
from ..disk_quota import human
from ..gpus import placement
from ..gpus.usage import usage_of as readings_of
from ..lifecycle import JobState, utcnow
from ..resources import format_memory
from .queue import admin_line, share_of
from .records import JobRecords
from .refusals import Invalid
from .spec import DEFAULT_CPUS, DEFAULT_GPUS, DEFAULT_MEMORY, MAX_WORKERS

if TYPE_CHECKING:
    from ..frameworks import Catalog
    from ..settings import GpulabSettings
    from .supervisor import JobSupervisor

log = logging.getLogger("gpulab.jobs")

#: the newest jobs the admin's overview lists (the jobs page pages through all of them)
RECENT_JOBS = 50
#: the users, and the notebooks, a page of the admin's overview lists (a cursor continues)
ADMIN_PAGE = 25
#: the newest of a user's jobs their home page lists
HOME_JOBS = 5


class NotebookReads(Protocol):
    """What the overview reads of the notebooks' records
    (:class:`gpulab.notebooks.records.NotebookRecords`)."""

    def list(self, user: str | None = None) -> list[dict]: ...

    def billed_minutes(self, user: str) -> int: ...

    def billed_minutes_of(self, users: list[str]) -> dict[str, int]: ...

    def users_after(self, after: str, limit: int) -> list[str]: ...

    def user_rows(self, users: list[str]) -> dict[str, dict]: ...

    def page_after(self, after: tuple[str, str] | None, limit: int) -> list[dict]: ...

    def counts(self) -> dict[str, int]: ...


def usage_of(jobs: JobRecords, notebooks: NotebookReads, user: str) -> dict:
    """``user``'s billed minutes, as the usage API answers them: ``user``, their jobs', their
    notebooks' and the two together (:func:`gpulab.billing.user_usage`)."""
    minutes = jobs.usage(user)["jobs_billed_minutes"]
    return {"user": user, **user_usage(minutes, notebooks.billed_minutes(user))}


def usage_and_share(sup: JobSupervisor, notebooks: NotebookReads, user: str) -> dict:
    """:func:`usage_of` and ``user``'s place in the fair share (``fair_share``:
    :func:`gpulab.jobs.queue.share_of`): what the usage API answers and the home page shows."""
    return {
        **usage_of(sup.records, notebooks, user),
        "fair_share": share_of(sup.s, sup.records, user),
    }


def month_usage(
    jobs: JobRecords,
    month: str | None,
    user: str | None,
    after: str | None = None,
    limit: int | None = None,
) -> dict:
    """The monthly usage report: every user's (``user``: only theirs) billed job minutes and
    GPU-minutes in ``month`` ("YYYY-MM", UTC; None: this month), from the kept totals
    (:func:`gpulab.jobs.usage.month_report`); ``after`` and ``limit``: a page of ``users``
    by name, ``next_after`` the name the next one starts after (None at the end). A month
    that is not one is refused (:class:`~gpulab.jobs.refusals.Invalid`, field ``month``)."""
    if month is None:  # an empty one is refused below: no silent default
        month = month_of(utcnow())
    try:
        month = parse_month(month)
    except ValueError as e:
        raise Invalid(str(e), field="month") from None
    if limit is None:
        return {"month": month, "users": jobs.month_usage(month, user)}
    rows = jobs.month_usage(month, user, None, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {"month": month, "users": rows, "next_after": rows[-1]["user"] if more else None}


def home_overview(
    sup: JobSupervisor, notebooks: NotebookReads, user: str, *, with_notebooks: bool
) -> dict:
    """``user``'s home page's data: their ``notebooks`` (only ``with_notebooks``: the caller
    may read them; else none), ``recent_jobs`` (the :data:`HOME_JOBS` newest), ``jobs_total``
    and ``job_counts`` (how many in each state), their ``usage`` (:func:`usage_and_share`), and the
    GPUs: ``gpus_free`` (None when the ledger cannot be read now), ``gpus_total`` and
    ``shared`` (each shareable device's free and total slots; none when unreadable)."""
    ledger = sup.ledger
    recent, jobs_total = sup.records.page(user, None, None, HOME_JOBS, 0, True)
    try:
        free = ledger.free_count()
    except Exception:
        free = None
    try:
        shared = ledger.shared_free()
    except Exception:
        shared = {}
    return {
        "notebooks": notebooks.list(user) if with_notebooks else [],
        "recent_jobs": recent,
        "job_counts": sup.records.counts(user),
        "jobs_total": jobs_total,
        "usage": usage_and_share(sup, notebooks, user),
        "gpus_free": free,
        "gpus_total": len(ledger.devices),
        "shared": shared,
    }


async def submit_form(
    sup: JobSupervisor, settings: GpulabSettings, user: str, groups: list[str]
) -> dict:
    """What the job submission form offers ``user`` (in ``groups``): the ``catalog``, its
    images' ``builds`` (flavour, CUDA needed: the engine's labels, the runtime's cache),
    ``default_env`` (the default framework's default version, "framework/version"),
    ``flavors``, the user's ``limits`` (and ``limit_memory``, readable), the GPUs:
    ``gpus_free`` (None when the ledger cannot be read now) and ``gpus_total``, the
    ``models`` (each one's free and total GPUs: :meth:`GpuLedger.free_by_model`) and node
    ``pools`` a job may ask for, a job's
    ``defaults`` (cpus, memory, gpus), ``max_workers``, ``max_tasks`` (of a job array) and
    ``max_timeout``."""
    limits = settings.limits_for(user, groups)
    ledger = sup.ledger
    try:
        free = await asyncio.to_thread(ledger.free_count)
        models = await asyncio.to_thread(ledger.free_by_model)
    except Exception:  # the form must render even if the ledger is unreachable
        free, models = (
            None,
            [{**m, "free": None} for m in placement.free_by_model(ledger.devices, ())],
        )
    catalog = settings.catalog
    default_env = f"{catalog.default_framework}/" + (
        catalog.frameworks[catalog.default_framework].default_version.id
        if catalog.default_framework in catalog.frameworks
        else ""
    )
    return {
        "catalog": catalog,
        "builds": await sup.runtime.image_builds(catalog.images()),
        "default_env": default_env,
        "flavors": list(settings.flavor_map.values()),
        "limits": limits,
        "limit_memory": format_memory(limits.memory),
        "gpus_free": free,
        "gpus_total": len(ledger.devices),
        "models": models,
        "pools": ledger.known_pools(),
        "defaults": {"cpus": DEFAULT_CPUS, "memory": DEFAULT_MEMORY, "gpus": DEFAULT_GPUS},
        "max_workers": MAX_WORKERS,
        "max_tasks": settings.max_job_tasks,
        "max_timeout": settings.job_max_timeout,
    }


async def with_gpu_usage(sup: JobSupervisor, job: dict) -> dict:
    """``job`` with ``gpu_usage``: what each of its GPUs does now (:func:`gpu_usage_rows`),
    read through the supervisor's reader (the one hang detection and the admin page read:
    ``JobContext.gpu_readings``, this host's NVML or a cluster's nodes' agents); [] where
    nothing can be read (no NVML, a node without a fresh reading)."""
    readings: list = []
    if job["state"] == JobState.RUNNING.value and job["devices"]:
        readings = await sup.ctx.gpu_readings()
    return {**job, "gpu_usage": gpu_usage_rows(job, readings)}


def gpu_usage_rows(job: dict, readings: list) -> list[dict]:
    """What a RUNNING job's GPUs do now, from the ``readings`` (named as the ledger names
    devices, as ``JobContext.gpu_readings`` gives them): a row per device its workers hold
    and that was read (``rank``, ``device`` as booked, ``utilization`` in percent, None for a
    MIG device, ``memory_used`` and ``memory_total`` in bytes), in rank then booking order;
    a device without a reading (a node whose agent has none fresh) has no row. Nothing for
    a job that is not RUNNING."""
    if job["state"] != JobState.RUNNING.value:
        return []
    rows = []
    for w in job["workers"]:
        for device in w["devices"]:
            for u in readings_of(readings, [device]):
                rows.append(
                    {
                        "rank": w["rank"],
                        "device": device,
                        "utilization": u.utilization,
                        "memory_used": u.memory_used,
                        "memory_total": u.memory_total,
                    }
                )
    return rows


async def admin_overview(
    sup: JobSupervisor,
    settings: GpulabSettings,
    notebooks: NotebookReads,
    *,
    users_after: str = "",
    notebooks_after: tuple[str, str] | None = None,
) -> dict:
    """The admin page's data, counts and pages only (its cost does not grow with the
    records kept): ``gpus`` (:func:`gpu_rows`), ``gpus_total`` and ``gpus_busy`` (devices
    configured, and devices with a booking), ``inventory`` (where the devices came from),
    ``notebooks`` (a page of :data:`ADMIN_PAGE`, by user and server, after
    ``notebooks_after``; ``notebooks_next``: the cursor of the next page, None at the end)
    and ``notebook_counts`` (how many in each state), ``jobs`` (the :data:`RECENT_JOBS`
    newest), ``job_counts`` (how many in each state) and ``jobs_total``, ``users``
    (:func:`user_rows`: a page of :data:`ADMIN_PAGE` users by name, after ``users_after``;
    ``users_next``: the name the next page starts after, None at the end),
    ``default_limits`` (a user's without an override), ``queue``
    (:func:`gpulab.jobs.queue.admin_line`: queued jobs and notebooks waiting for GPUs, in
    line), ``month_report`` (this month's billed job minutes of the page's users:
    :func:`month_usage`; each user's row has theirs as ``month``, None if none) and
    ``images`` (:func:`image_rows`: the catalog's images, their builds from the engine's
    labels, judged against this host's driver)."""
    readings = await sup.ctx.gpu_readings()  # what each device does now
    found = await asyncio.to_thread(
        _platform, sup, settings, notebooks, readings, users_after, notebooks_after
    )
    runtime = sup.runtime
    builds = await runtime.image_builds(settings.catalog.images())
    return {**found, "images": image_rows(settings.catalog, builds, runtime.driver_cuda)}


def users_page(
    jobs: JobRecords, notebooks: NotebookReads, after: str, limit: int
) -> tuple[list[str], str | None]:
    """A page of the users with a job or a notebook record, by name, after ``after``: the
    names and the cursor of the next page (the last name; None at the end). Each side's
    index is walked only as far as the page needs."""
    names = sorted(
        set(jobs.owners_after(after, limit + 1)) | set(notebooks.users_after(after, limit + 1))
    )
    page = names[:limit]
    return page, (page[-1] if len(names) > limit else None)


def _platform(
    sup: JobSupervisor,
    settings: GpulabSettings,
    notebooks: NotebookReads,
    readings: list,
    users_after: str,
    notebooks_after: tuple[str, str] | None,
) -> dict:
    """What :func:`admin_overview` reads of the records and ledgers (blocking)."""
    records = sup.records
    allocations = sup.ledger.allocations()
    held_jobs = [a["workload"].split("/")[-1] for a in allocations if a["kind"] == "job"]
    nbs = notebooks.page_after(notebooks_after, ADMIN_PAGE + 1)
    recent, _ = records.page(None, None, None, RECENT_JOBS, 0, True, with_total=False)
    job_counts = records.everyones_counts()
    month = month_of(utcnow())
    users, users_next, billed = _users_section(
        sup, settings, notebooks, allocations, users_after, month
    )
    return {
        "gpus": gpu_rows(sup.ledger.holdings(allocations), readings, records.existing(held_jobs)),
        "gpus_total": len(sup.ledger.devices),
        "inventory": sup.runtime.inventory,
        "gpus_busy": len({a["device"] for a in allocations}),
        "notebooks": nbs[:ADMIN_PAGE],
        "notebooks_next": (
            (nbs[ADMIN_PAGE - 1]["user"], nbs[ADMIN_PAGE - 1]["server"])
            if len(nbs) > ADMIN_PAGE
            else None
        ),
        "notebook_counts": notebooks.counts(),
        "jobs": recent,
        "job_counts": job_counts,
        "jobs_total": sum(job_counts.values()),
        "users": users,
        "users_after": users_after,
        "users_next": users_next,
        "default_limits": settings.limits_for("", []),
        "queue": admin_line(settings, records),
        # this month's billed job minutes of the page's users, from the kept totals
        "month_report": {"month": month, "users": billed},
    }


#: seconds the admin page's table of users (a page of them: counts, GPUs and disk held,
#: billed minutes) may be shown again to the next admin when no job of this process changed
#: state meanwhile; what the hub's process changes (a notebook started) shows at most this
#: late. Measured (bench/bench_scale.py, 100,000 jobs): the table's reads and its 25 rows
#: were what made the loaded page cost 1.4-1.7 times the empty one.
USERS_MAX_AGE = 5.0
#: pages of users kept (each admin's cursor its own): the oldest is dropped past this
USERS_KEPT_PAGES = 32
#: per database: {(instance, users_after): (generation, read at, month, (users, next, billed))}
_USERS_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_USERS_KEPT_LOCK = threading.Lock()  # (the page is read on several threads at once)


def _users_section(
    sup: JobSupervisor,
    settings: GpulabSettings,
    notebooks: NotebookReads,
    allocations: list[dict],
    users_after: str,
    month: str,
) -> tuple[list[dict], str | None, list[dict]]:
    """The admin page's page of users after ``users_after``: their rows (:func:`user_rows`
    with this ``month``'s billed minutes as ``month``), the next page's cursor and the
    month's report of them; reused as :data:`USERS_MAX_AGE` says (copies: a reader's
    changes never reach the next)."""
    records = sup.records
    key = (records.instance, users_after)
    generation = records.generation()
    now = time.monotonic()
    with _USERS_KEPT_LOCK:
        pages = _USERS_KEPT.setdefault(records.db, {})
        kept = pages.get(key)
    fresh = kept is not None and now - kept[1] < USERS_MAX_AGE
    if fresh and kept[0] == generation and kept[2] == month:
        return copy.deepcopy(kept[3])
    names, users_next = users_page(records, notebooks, users_after, ADMIN_PAGE)
    billed = records.month_usage(month, None, names)
    users = user_rows(
        settings,
        names,
        records.owner_rows(names),
        notebooks.user_rows(names),
        allocations,
        sup.disk.bookings(),
        _usage_of_page(records, notebooks, names),
    )
    this_month = {r["user"]: r for r in billed}
    for u in users:  # the month's column of the users' table
        u["month"] = this_month.get(u["name"])
    found = (users, users_next, billed)
    if records.generation() == generation:  # no change began and ended meanwhile: keep it
        with _USERS_KEPT_LOCK:
            pages.pop(key, None)
            pages[key] = (generation, now, month, copy.deepcopy(found))
            while len(pages) > USERS_KEPT_PAGES:
                pages.pop(next(iter(pages)))
    return found


def _usage_of_page(jobs: JobRecords, notebooks: NotebookReads, names: list[str]) -> dict:
    """:func:`usage_of` of each of ``names``, read for the page at once."""
    minutes = jobs.usage_of_owners(names)
    nb = notebooks.billed_minutes_of(names)
    return {n: {"user": n, **user_usage(minutes.get(n, 0), nb.get(n, 0))} for n in names}


def image_rows(catalog: Catalog, builds: dict[str, ImageBuild], driver_cuda: str) -> list[dict]:
    """The catalog's images as the admin reads them: framework, version, image, its
    ``builds`` entry (flavour, the CUDA it needs), why GPU workloads on it are refused on a
    driver that supports ``driver_cuda`` ("" unknown; "" if not refused) and, when they are
    not, what the driver falls short of ("" if nothing)."""
    rows = []
    for f in catalog.frameworks.values():
        for v in f.versions:
            build = builds.get(v.image)
            needed = build.cuda if build else ""
            refused = cuda_refusal(v.image, needed, 1, driver_cuda) or ""
            rows.append(
                {
                    "framework": f.title,
                    "version": v.id,
                    "image": v.image,
                    "flavour": build.describe() if build else "",
                    "refused": refused,
                    "short": "" if refused else cuda_shortfall(v.image, needed, driver_cuda) or "",
                }
            )
    return rows


def gpu_rows(holdings: list[dict], readings: list, job_ids: set[str]) -> list[dict]:
    """The ledger's ``holdings`` (:meth:`~gpulab.gpus.ledger.GpuLedger.holdings`) as the
    admin reads them: each configured device's ``activity`` now, from its NVML ``readings``
    (utilization, memory used and total; None when it was not read), and each holder's
    ``job_id`` (a job that still exists: its page) or ``notebook`` (``user/server``)."""
    out = []
    for g in holdings:
        now = readings_of(readings, [g["key"]]) if g["key"] is not None else []
        activity = (
            {
                "utilization": now[0].utilization,
                "memory_used": human(now[0].memory_used),
                "memory_total": human(now[0].memory_total),
            }
            if now
            else None
        )
        for a in g["held"]:
            parts = a["workload"].split("/")
            a["job_id"] = parts[-1] if a["kind"] == "job" and parts[-1] in job_ids else None
            a["notebook"] = "/".join(parts[-2:]) if a["kind"] == "notebook" else None
        out.append({**g, "activity": activity})
    return out


def user_rows(
    settings: GpulabSettings,
    names: list[str],
    jobs: dict[str, dict],
    notebooks: dict[str, dict],
    allocations: list[dict],
    bookings: list[dict],
    usage: dict[str, dict],
) -> list[dict]:
    """A row for each of ``names`` (a page of users): their groups (as their newest job
    remembers them), limits and quotas, their notebooks (running / all), jobs (active,
    queued / all), as the records count them for the page (``jobs``:
    :meth:`JobRecords.owner_rows`; ``notebooks``: the notebooks' ``user_rows``), the GPUs
    they hold (a shared device's slot counts as its fraction), the disk their volumes and
    clones hold on nodes against their disk quota, and ``usage[name]``, their billed
    minutes."""
    gpus_of: Counter = Counter()
    for a in allocations:
        gpus_of[a["owner"]] += a["gpus"]
    disk_of: Counter = Counter()
    for b in bookings:
        disk_of[b["owner"]] += b["bytes"]
    rows = []
    for name in names:
        mine = jobs.get(name) or {}
        nbs = notebooks.get(name) or {}
        groups = mine.get("groups") or []
        limits = settings.limits_for(name, groups)
        disk_quota = settings.disk_quota_for(name, groups)
        rows.append(
            {
                "name": name,
                "groups": groups,
                "quota": settings.quota_for(name, groups),
                "limits": limits,
                "limit_memory": format_memory(limits.memory),
                "notebooks": nbs.get("notebooks", 0),
                "notebooks_running": nbs.get("notebooks_running", 0),
                "jobs": mine.get("jobs", 0),
                "jobs_active": mine.get("jobs_active", 0),
                "jobs_queued": mine.get("jobs_queued", 0),
                "gpus_held": round(gpus_of.get(name, 0), 4),
                "usage": usage.get(name),
                "disk_held": human(disk_of.get(name, 0)),
                "disk_quota": human(disk_quota) if disk_quota is not None else "∞",
            }
        )
    return rows
