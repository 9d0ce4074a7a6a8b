"""The jobs' pages: the list, the submit form, a job's page and its buttons. They call what
the API calls (:mod:`gpulab.jobs.actions`), so a page can never accept what the API refuses."""

from __future__ import annotations

import asyncio
import functools
from urllib.parse import urlencode

from ...jobs import actions, output
from ...jobs.gang import workers_of
from ...jobs.overview import submit_form, with_gpu_usage
from ...jobs.refusals import JobRefused
from ...resources import format_memory
from ..base import JOBS_MANAGE, JOBS_READ, ApiError, answer_refusals, authenticated
from .base import ACTIVE_STATES, ENDED_STATES, JOB_STATES, PageHandler
from .job_form import FORM_FIELDS, form_field, form_to_job

#: jobs a page of the jobs page shows (newest first; "older jobs" continues after the last)
JOBS_PAGE_ROWS = 200


class JobsPage(PageHandler):
    @authenticated
    async def get(self):
        me = self.require(JOBS_READ)
        want_all = self.get_argument("all", "false").lower() == "true"
        user = self.whose(
            me, None if want_all else me["name"], "Only administrators may list other users' jobs."
        )
        state = self.get_argument("state", "", strip=False)
        cursor = self.get_argument("cursor", None, strip=False)
        with answer_refusals():
            # a page at a time, newest first, the next one after the last job shown: a page
            # that rendered every job ever run would grow forever
            found = await asyncio.to_thread(
                functools.partial(
                    actions.list_jobs,
                    self.jobs,
                    user,
                    states=state,
                    limit=str(JOBS_PAGE_ROWS),
                    newest_first=True,
                    cursor=cursor,
                )
            )
        keep = [(k, v) for k, v in (("all", "true" if want_all else ""), ("state", state)) if v]
        await self.render_big_page(
            "jobs.html",
            cursor=cursor,
            first_page=f"?{urlencode(keep)}" if keep else "",
            next_page=f"?{urlencode([*keep, ('cursor', found.next_cursor)])}"
            if found.next_cursor
            else "",
            jobs=found.jobs,
            jobs_total=found.total,
            states=JOB_STATES,
            chosen=found.states,
            want_all=want_all,
            presets={"active": ACTIVE_STATES + ["QUEUED"], "ended": ENDED_STATES},
        )


class SubmitJobPage(PageHandler):
    @authenticated
    async def get(self):
        self.require(JOBS_MANAGE)
        await self.show_form({}, {})

    @authenticated
    async def post(self):
        me = self.require(JOBS_MANAGE)
        form = {k: self.get_body_argument(k, "") for k in FORM_FIELDS}
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
        me = self.current_user
        offered = await submit_form(
            self.supervisor, self.settings["gpulab"], me["name"], list(me.get("groups") or [])
        )
        self.render_page(
            "submit.html",
            status=status,
            form=form,
            errors=errors,
            format_memory=format_memory,
            **offered,
        )


class JobPage(PageHandler):
    @authenticated
    async def get(self, job_id: str):
        job = await self.own_job(job_id)
        job = await with_gpu_usage(self.supervisor, job)  # with what its GPUs do now
        first = output.first_rank(job)  # None: every rank's output
        self.render_page(
            "job.html",
            job=job,
            workers=workers_of(job),
            first_rank="" if first is None else str(first),
            ended=job["state"] in ENDED_STATES,
            ended_states=ENDED_STATES,
            can_manage=self.has(JOBS_MANAGE),
            api=self.page_url("api/jobs", job_id),
        )


class JobActionPage(PageHandler):
    """The detail page's buttons: the job actions the API takes, answered with a redirect to
    the job's page (a rerun's: the copy's)."""

    @authenticated
    async def post(self, job_id: str, action: str):
        job = await self.own_job(job_id, JOBS_MANAGE)
        with answer_refusals():
            acted = await actions.act(
                self.supervisor,
                self.settings["gpulab"],
                job,
                action,
                admin=self.is_admin(self.current_user),
            )
        if acted.failed:
            raise ApiError(502, acted.job.get("message", f"{action} failed"))
        target = acted.job["id"] if acted.created else job_id
        self.redirect(self.page_url("jobs", target), status=303)
