"""REST API of training jobs (under /services/gpulab/api/jobs).

Permissions are JupyterHub RBAC scopes: ``custom:gpulab:jobs:read`` to read one's own jobs,
``custom:gpulab:jobs:manage`` to submit and act on them; tokens carrying
``custom:gpulab:admin`` (and only those: the hub's admin flag counts for nothing) see and act on
everyone's. Another user's job is a 404 with the same body as an unknown id: its existence is
not revealed.
"""

from __future__ import annotations

import functools

from ...jobs import actions
from ...jobs.overview import with_gpu_usage
from ..base import JOBS_MANAGE, JOBS_READ, BaseHandler, answer_refusals, authenticated, read


class JobsHandler(BaseHandler):
    @authenticated
    async def get(self):
        """List jobs: yours (admins: ?user=NAME or ?all=true), ?state=A,B, ?label=k=v; a page
        (?limit=), after ?cursor= (the previous page's ``next`` carries it) or ?offset=."""
        me = self.require(JOBS_READ)
        user = self.get_argument("user", me["name"])
        user = self.whose(
            me, None if self.flag("all") else user, "only admins may list other users' jobs"
        )
        limit, offset = self.page_query()
        with answer_refusals():
            found = await read(
                functools.partial(
                    actions.list_jobs,
                    self.jobs,
                    user,
                    states=self.get_argument("state", "", strip=False),
                    labels=self.get_arguments("label"),
                    limit=limit,
                    offset=offset,
                    cursor=self.get_argument("cursor", None, strip=False),
                )
            )
        self.write_page(
            "jobs", found.jobs, found.total, found.limit, found.offset, found.next_cursor
        )

    @authenticated
    async def post(self):
        """Submit a job; 201 with the job, or 400 naming the field and the reason."""
        me = self.require(JOBS_MANAGE)
        raw = self.body()
        with answer_refusals():
            job = await actions.submit(
                self.supervisor,
                self.settings["gpulab"],
                raw,
                owner=me["name"],
                groups=list(me.get("groups") or []),
                admin=self.is_admin(me),
            )
        self.set_header("Location", self.request.path.rstrip("/") + "/" + job["id"])
        self.write_json(job, 201)


class JobHandler(BaseHandler):
    @authenticated
    async def get(self, job_id: str):
        """The job, with what its GPUs do now (``gpu_usage``: only here, not in lists)."""
        job = await self.own_job(job_id)
        self.write_json(await with_gpu_usage(self.supervisor, job))

    @authenticated
    async def delete(self, job_id: str):
        """Delete an ended job: its record, saved logs, container and volumes."""
        job = await self.own_job(job_id, JOBS_MANAGE)
        with answer_refusals():
            await actions.delete(self.supervisor, job)
        self.set_status(204)
        self.finish()


class JobEventsHandler(BaseHandler):
    @authenticated
    async def get(self, job_id: str):
        job = await self.own_job(job_id)
        self.write_json({"id": job_id, "events": job["history"]})


class JobActionHandler(BaseHandler):
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
        if acted.created:
            jobs_path = self.request.path.rsplit("/", 2)[0]
            self.set_header("Location", f"{jobs_path}/{acted.job['id']}")
        status = 201 if acted.created else 202 if acted.pending else 502 if acted.failed else 200
        self.write_json(acted.job, status)
