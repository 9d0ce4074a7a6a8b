"""The gpulab web pages (HTML from Jinja templates) served by the service beside its JSON API.

Pages call what the API calls: the same records, the same job submission and job actions
(:mod:`gpulab.jobs.actions`), so a page can never accept what the API refuses. Identity is the
hub's OAuth cookie; JupyterHub's ``HubOAuthenticated`` ignores that cookie on a POST (or a
script's fetch) whose ``_xsrf`` token is missing or wrong, so every form carries
``xsrf_form_html()`` and scripts send ``X-XSRFToken``. API clients with ``Authorization:
token`` are not affected.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.utils import url_path_join
from tornado import web

from ..durations import format_duration
from ..jobs import actions
from ..jobs.actions import JobRefused
from ..jobs.gang import workers_of
from ..jobs.records import ACTIVE, ENDED
from ..jobs.spec import DEFAULT_CPUS, DEFAULT_GPUS, DEFAULT_MEMORY, MAX_WORKERS
from ..lifecycle import JobState, NotebookState
from ..resources import format_memory
from .app_base import NB_READ, ApiError, answer_refusals, authenticated
from .jobs_api import MANAGE, READ, JobsBase
from .logs_api import MAX_LOG_STREAMS_PER_USER
from .pages_extras import EXTRA_FORM_FIELDS, form_extras

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

_env = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)

JOB_STATES = [s.value for s in JobState]
ENDED_STATES = sorted(s.value for s in ENDED)
ACTIVE_STATES = sorted(s.value for s in ACTIVE)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def when(value: str | None) -> str:
    """An ISO time as 'YYYY-MM-DD HH:MM:SS' (UTC)."""
    t = _parse_time(value)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if t else "—"


def ago(value: str | None) -> str:
    """How long ago: '42 s', '5 min', '3 h 2 min', '4 d 1 h'."""
    t = _parse_time(value)
    if t is None:
        return ""
    s = max(0, int((datetime.now(UTC) - t).total_seconds()))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def state_class(state: str | None) -> str:
    """CSS class of a state badge: ok / run / wait / bad / off."""
    if state in ("DONE",):
        return "ok"
    if state in ("RUNNING",):
        return "run"
    if state in ("FAILED", "ERROR", "SYNC_FAILED", "TIMEOUT"):
        return "bad"
    if state in ("STOPPED", "INTERRUPTED", "DELETED"):
        return "off"
    return "wait"


def gpu_total(job: dict) -> str:
    """A job's GPUs in all: '1'; a distributed job's total, then how it is split:
    '4 (2 workers × 2)'."""
    gpus = ((job.get("spec") or {}).get("resources") or {}).get("gpus")
    if gpus is None:
        return "—"
    n = workers_of(job)
    return str(gpus) if n == 1 else f"{n * int(gpus)} ({n} workers × {gpus})"


_env.filters["when"] = when
_env.filters["workers"] = workers_of
_env.filters["gpu_total"] = gpu_total
_env.filters["ago"] = ago
_env.filters["state_class"] = state_class
_env.filters["shjoin"] = lambda words: shlex.join(str(w) for w in words)
_env.filters["duration"] = lambda s: format_duration(float(s)) if s is not None else "—"


def _service_prefix() -> str:
    return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulab/")


def _hub_prefix() -> str:
    return url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "hub/")


def _users_prefix() -> str:
    return url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "user/")


class PageHandler(JobsBase):
    """Renders templates; errors are HTML pages (a clear 403/404), not JSON."""

    def page_url(self, *parts: str) -> str:
        return url_path_join(_service_prefix(), *parts)

    def render_page(self, template: str, status: int = 200, **ctx: Any) -> None:
        me = getattr(self, "_current_user", None)
        base = {
            "me": me,
            "is_admin": bool(me) and self.is_admin(me),
            "prefix": _service_prefix(),
            "hub": _hub_prefix(),
            "users_prefix": _users_prefix(),
            "static": self.page_url("static") + "/",
            "xsrf_token": self.xsrf_token.decode("ascii") if me else "",
            "xsrf_form_html": self.xsrf_form_html if me else (lambda: ""),
            "request_path": self.request.path,
        }
        html = _env.get_template(template).render(**base, **ctx)
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(html)

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, ApiError):
            message = exc.message
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if status_code == 403 and getattr(self, "_current_user", None) is None:
            # a form posted without (or with a stale) XSRF token is not authenticated
            message = (
                "You are not logged in here, or the form had expired. Reload the page "
                "(log in again if asked) and try once more."
            )
        titles = {
            403: "Not allowed",
            404: "Not found",
            400: "Not accepted",
            409: "Not possible now",
        }
        try:
            self.render_page(
                "error.html",
                status=status_code,
                code=status_code,
                title=titles.get(status_code, "Something went wrong"),
                message=message,
            )
        except Exception:  # never fail while reporting a failure
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"{status_code}: {message}\n")

    def require_admin(self) -> dict:
        me = self.current_user
        if not self.is_admin(me):
            raise ApiError(
                403,
                "This page is for gpulab administrators. Your own notebooks and jobs are on "
                "the gpulab home page.",
            )
        return me


class HomePage(PageHandler):
    @authenticated
    async def get(self):
        me = self.require(READ)
        notebooks = (
            await asyncio.to_thread(self.records.list, me["name"]) if self.has(NB_READ) else []
        )
        recent, jobs_total = await asyncio.to_thread(
            self.jobs.page, me["name"], None, None, 5, 0, True
        )
        counts = await asyncio.to_thread(self.jobs.counts, me["name"])
        usage = await asyncio.to_thread(self.jobs.usage, me["name"])
        nb_minutes = await asyncio.to_thread(self.records.billed_minutes, me["name"])
        free, total = await self.gpu_counts()
        try:
            shared = await asyncio.to_thread(self.supervisor.ledger.shared_free)
        except Exception:
            shared = {}
        self.render_page(
            "home.html",
            notebooks=notebooks,
            recent_jobs=recent,
            job_counts=counts,
            jobs_total=jobs_total,
            usage={
                "jobs": usage["jobs_billed_minutes"],
                "notebooks": nb_minutes,
                "total": usage["jobs_billed_minutes"] + nb_minutes,
            },
            gpus_free=free,
            gpus_total=total,
            shared=shared,
            running=NotebookState.RUNNING.value,
        )

    async def gpu_counts(self) -> tuple[int | None, int]:
        ledger = self.supervisor.ledger
        try:
            return await asyncio.to_thread(ledger.free_count), len(ledger.devices)
        except Exception:
            return None, len(ledger.devices)


#: jobs the jobs page shows (the newest; the REST API pages through all of them)
JOBS_PAGE_ROWS = 200


class JobsPage(PageHandler):
    @authenticated
    async def get(self):
        me = self.require(READ)
        want_all = self.get_argument("all", "false").lower() == "true"
        if want_all and not self.is_admin(me):
            raise ApiError(403, "Only administrators may list other users' jobs.")
        chosen = [s for s in self.get_argument("state", "").upper().split(",") if s]
        unknown = [s for s in chosen if s not in JOB_STATES]
        if unknown:
            raise ApiError(400, f"unknown state {unknown[0]}; states are {', '.join(JOB_STATES)}")
        # the newest page only: a page that rendered every job ever run would grow forever
        rows, total = await asyncio.to_thread(
            self.jobs.page,
            None if want_all else me["name"],
            set(chosen) or None,
            None,
            JOBS_PAGE_ROWS,
            0,
            True,
        )
        self.render_page(
            "jobs.html",
            jobs=rows,
            jobs_total=total,
            states=JOB_STATES,
            chosen=chosen,
            want_all=want_all,
            presets={"active": ACTIVE_STATES + ["QUEUED"], "ended": ENDED_STATES},
        )


# form field -> the spec fields whose errors are shown next to it
_FIELD_OF = {
    "framework": "environment",
    "version": "environment",
    "image": "environment",
    "resources.cpus": "cpus",
    "resources.memory": "memory",
    "resources.gpus": "gpus",
    "resources": "flavor",
    "args": "command",
    "hang_restart": "timeout",
    "env": "env",
    "ports": "ports",
    "git": "git",
    "working_dir": "working_dir",
    "read_only_rootfs": "read_only",
}


def form_field(spec_field: str | None) -> str:
    if not spec_field:
        return "form"
    if spec_field in _FIELD_OF:
        return _FIELD_OF[spec_field]
    head = spec_field.split(".", 1)[0].split("[", 1)[0]
    return _FIELD_OF.get(head, head)


def form_to_job(form: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """The submit form's strings as a job body (JSON types), or errors by form field."""
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if form.get("name"):
        raw["name"] = form["name"]
    env_choice = form.get("environment", "")
    if env_choice:
        fw, _, version = env_choice.partition("/")
        raw["framework"] = fw
        if version:
            raw["version"] = version
    command = form.get("command", "").strip()
    if not command:
        errors["command"] = "give the command to run, e.g. python train.py"
    else:
        raw["command"] = command
    if form.get("flavor"):
        raw["flavor"] = form["flavor"]
    resources: dict[str, Any] = {}
    for key, conv in (("cpus", float), ("gpus", int)):
        value = form.get(key, "").strip()
        if value:
            try:
                resources[key] = conv(value)
            except ValueError:
                kind = "a whole number" if conv is int else "a number"
                errors[key] = f"{key} must be {kind}, not {value!r}"
    if form.get("memory", "").strip():
        resources["memory"] = form["memory"].strip()
    if resources:
        raw["resources"] = resources
    workers = form.get("workers", "").strip()
    if workers:
        try:
            raw["workers"] = int(workers)
        except ValueError:
            errors["workers"] = (
                f"workers must be a whole number from 1 to {MAX_WORKERS}, not {workers!r}"
            )
    env: dict[str, str] = {}
    for n, line in enumerate(form.get("env", "").splitlines(), 1):
        if not line.strip():
            continue
        if "=" not in line:
            errors["env"] = f"line {n}: write NAME=value, not {line.strip()!r}"
            break
        k, v = line.split("=", 1)
        env[k.strip()] = v
    if env:
        raw["env"] = env
    volumes = [v.strip() for v in form.get("volumes", "").splitlines() if v.strip()]
    if volumes:
        raw["volumes"] = volumes
    if form.get("timeout", "").strip():
        raw["timeout"] = form["timeout"].strip()
    retries = form.get("retries", "").strip()
    if retries:
        try:
            raw["retries"] = int(retries)
        except ValueError:
            errors["retries"] = f"retries must be a whole number, not {retries!r}"
    raw["preemptible"] = form.get("preemptible") in ("on", "true", "1")
    form_extras(form, raw, errors)  # ports, secrets, git, working dir, read-only root
    return raw, errors


_FORM_FIELDS = (
    "name",
    "environment",
    "command",
    "flavor",
    "cpus",
    "memory",
    "gpus",
    "workers",
    "env",
    "volumes",
    "timeout",
    "retries",
    "preemptible",
    *EXTRA_FORM_FIELDS,
)


class SubmitJobPage(PageHandler):
    @authenticated
    async def get(self):
        self.require(MANAGE)
        await self.show_form({}, {})

    @authenticated
    async def post(self):
        me = self.require(MANAGE)
        form = {k: self.get_body_argument(k, "") for k in _FORM_FIELDS}
        raw, errors = form_to_job(form)
        if errors:
            return await self.show_form(form, errors, status=400)
        try:
            job = await actions.submit(
                self.supervisor,
                self.settings["gpulab"],
                raw,
                owner=me["name"],
                groups=list(me.get("groups") or []),
                admin=self.is_admin(me),
            )
        except JobRefused as e:
            errors = {form_field(e.field): e.message}
            return await self.show_form(form, errors, status=e.status)
        self.redirect(self.page_url("jobs", job["id"]), status=303)

    async def show_form(self, form: dict, errors: dict, status: int = 200) -> None:
        s = self.settings["gpulab"]
        me = self.current_user
        limits = s.limits_for(me["name"], list(me.get("groups") or []))
        ledger = self.supervisor.ledger
        try:
            free = await asyncio.to_thread(ledger.free_count)
        except Exception:
            free = None
        catalog = s.catalog
        default_env = f"{catalog.default_framework}/" + (
            catalog.frameworks[catalog.default_framework].default_version.id
            if catalog.default_framework in catalog.frameworks
            else ""
        )
        self.render_page(
            "submit.html",
            status=status,
            form=form,
            errors=errors,
            catalog=catalog,
            default_env=default_env,
            flavors=list(s.flavor_map.values()),
            format_memory=format_memory,
            limits=limits,
            limit_memory=format_memory(limits.memory),
            gpus_free=free,
            gpus_total=len(ledger.devices),
            defaults={"cpus": DEFAULT_CPUS, "memory": DEFAULT_MEMORY, "gpus": DEFAULT_GPUS},
            max_workers=MAX_WORKERS,
            max_timeout=s.job_max_timeout,
        )


class JobPage(PageHandler):
    @authenticated
    async def get(self, job_id: str):
        job = await self.own_job(job_id)
        workers = workers_of(job)
        self.render_page(
            "job.html",
            job=job,
            workers=workers,
            # following every rank takes one log stream each: over the cap, one rank at first
            first_rank=""
            if workers <= MAX_LOG_STREAMS_PER_USER // 2 or job["state"] in ENDED_STATES
            else "0",
            ended=job["state"] in ENDED_STATES,
            ended_states=ENDED_STATES,
            can_manage=self.has(MANAGE),
            api=self.page_url("api/jobs", job_id),
        )


class JobActionPage(PageHandler):
    """The detail page's buttons: the job actions the API takes, answered with a redirect to
    the job's page (a rerun's: the copy's)."""

    @authenticated
    async def post(self, job_id: str, action: str):
        job = await self.own_job(job_id, MANAGE)
        sup, target = self.supervisor, job_id
        with answer_refusals():
            if action == "interrupt":
                await actions.interrupt(sup, job)
            elif action == "resume":
                await actions.resume(sup, job)
            elif action == "rerun":
                admin = self.is_admin(self.current_user)
                target = (await actions.rerun(sup, self.settings["gpulab"], job, admin=admin))["id"]
            elif action == "push":
                result = await actions.retry_push(sup, job)
                if result["state"] == "SYNC_FAILED":
                    raise ApiError(502, result.get("message", f"{action} failed"))
            else:
                raise ApiError(404, f"no action {action}")
        self.redirect(self.page_url("jobs", target), status=303)


class StaticHandler(web.StaticFileHandler):
    """The pages' CSS and JS, from the package (no CDN)."""

    def initialize(self, path: str = str(STATIC), default_filename: str | None = None) -> None:
        super().initialize(path=path, default_filename=default_filename)
