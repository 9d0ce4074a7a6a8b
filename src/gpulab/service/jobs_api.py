"""REST API of training jobs (under /services/gpulab/api/jobs).

Permissions are JupyterHub RBAC scopes: ``custom:gpulab:jobs:read`` to read one's own jobs,
``custom:gpulab:jobs:manage`` to submit and act on them; tokens carrying
``custom:gpulab:admin`` (and only those: the hub's admin flag counts for nothing) see and act on
everyone's. Another user's job is a 404 with the same body as an unknown id: its existence is
not revealed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from ..errors import FieldError
from ..jobs.records import ACTIVE, ENDED, QueueFull
from ..jobs.scheduler import can_ever_fit
from ..jobs.spec import parse_job_spec
from ..lifecycle import InvalidTransition, JobState
from .app_base import (
    ASCII_SPACE,
    JOBS_MANAGE,
    JOBS_READ,
    ApiError,
    BaseHandler,
    authenticated,
    read,
)

J = JobState
#: a started job can be interrupted until it is FINALIZING (its outcome is decided then)
INTERRUPTIBLE = frozenset(ACTIVE - {J.FINALIZING})
READ, MANAGE = JOBS_READ, JOBS_MANAGE


class JobsBase(BaseHandler):
    @property
    def supervisor(self):
        return self.settings["supervisor"]

    @property
    def jobs(self):
        return self.supervisor.records

    async def own_job(self, job_id: str, scope: str = READ) -> dict:
        me = self.require(scope)
        job = await read(self.jobs.get, job_id)
        if job is None or (job["owner"] != me["name"] and not self.is_admin(me)):
            raise ApiError(404, f"no job {job_id}")
        return job

    def body(self) -> dict:
        try:
            data = json.loads(self.request.body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            raise ApiError(400, "the body must be a JSON object", field="body") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object", field="body")
        return data


class JobsHandler(JobsBase):
    @authenticated
    async def get(self):
        """List jobs: yours (admins: ?user=NAME or ?all=true), ?state=A,B, ?label=k=v."""
        me = self.require(READ)
        user = self.get_argument("user", me["name"])
        want_all = self.flag("all")
        if (user != me["name"] or want_all) and not self.is_admin(me):
            raise ApiError(403, "only admins may list other users' jobs")
        states = None
        raw = self.get_argument("state", "", strip=False)
        if raw.strip(ASCII_SPACE):
            # names in any (ASCII) case, around ASCII white space: what the document's pattern
            # says ("ſ".upper() is "S", and "\xa0" is white space to str.strip())
            states = {s.strip(ASCII_SPACE) for s in raw.split(",")}
            states = {s.upper() if s.isascii() else s for s in states}
            unknown = states - {s.value for s in JobState}
            if unknown:
                raise ApiError(
                    400,
                    f"unknown state {sorted(unknown)[0]}; states are: "
                    + ", ".join(s.value for s in JobState),
                    field="state",
                )
        labels = {}
        for item in self.get_arguments("label"):
            if "=" not in item:
                raise ApiError(400, "label filters are key=value", field="label")
            k, v = item.split("=", 1)
            labels[k] = v
        limit, offset = self.page_args()
        rows, total = await read(
            self.jobs.page, None if want_all else user, states, labels or None, limit, offset
        )
        self.write_page("jobs", rows, total, limit, offset)

    @authenticated
    async def post(self):
        """Submit a job; 201 with the job, or 400 naming the field and the reason."""
        me = self.require(MANAGE)
        raw = self.body()
        job = await self.submit(me, raw)
        self.set_header("Location", self.request.path.rstrip("/") + "/" + job["id"])
        self.write_json(job, 201)

    async def submit(self, me: dict, raw: dict) -> dict:
        s = self.settings["gpulab"]
        user, groups = me["name"], list(me.get("groups") or [])
        host_gpus, gpu_home = self.supervisor.ledger.gpu_home()
        store = self.supervisor.secrets
        secret_names = (
            frozenset(i.name for i in await read(store.names, user)) if store.available else None
        )
        try:
            spec = parse_job_spec(
                raw,
                catalog=s.catalog,
                flavors=s.flavor_map,
                limits=s.limits_for(user, groups),
                default_flavor=None,
                allowed_images=frozenset(s.allowed_images),
                storage=s.storage,
                user=user,
                host_gpus=host_gpus,
                max_timeout=s.job_max_timeout,
                gpu_home=gpu_home,
                secret_names=secret_names,
                git_allowed=s.job_git_sources,
            )
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None
        if spec.priority > s.max_user_priority and not self.is_admin(self.current_user):
            raise ApiError(
                403,
                f"priority {spec.priority} is above {s.max_user_priority}, the highest a user "
                "may ask for (higher ones need the custom:gpulab:admin scope)",
                field="priority",
            )
        quota = s.quota_for(user, groups)
        # a gang's size is checked against every node by the ledger; its sum against the quota
        fits_on = host_gpus if spec.workers == 1 else spec.total_gpus
        if spec.workers > s.max_job_workers:
            raise ApiError(
                400,
                f"{spec.workers} workers requested but one user's jobs may have at most "
                f"{s.max_job_workers} together",
                field="workers",
            )
        why = self.supervisor.ledger.gang_refusal(spec.resources.gpus, spec.workers)
        why = why or can_ever_fit(spec.total_gpus, fits_on, quota, spec.preemptible, gpu_home)
        if why and spec.workers > 1 and not why.startswith(f"{spec.workers} workers"):
            why = f"{spec.workers} workers of {spec.resources.gpus} GPU(s) each: {why}"
        if why:
            raise ApiError(400, why, field="workers" if spec.workers > 1 else "resources.gpus")
        try:
            job = await asyncio.to_thread(
                self.jobs.create,
                user,
                spec.to_json(),
                spec.name,
                groups,
                max_unfinished=s.max_queued_jobs,
            )
        except QueueFull as e:
            raise ApiError(409, str(e)) from None
        self.supervisor.wake.set()
        return job


class JobHandler(JobsBase):
    @authenticated
    async def get(self, job_id: str):
        self.write_json(await self.own_job(job_id))

    @authenticated
    async def delete(self, job_id: str):
        """Delete an ended job: its record, saved logs, container and volumes."""
        job = await self.own_job(job_id, MANAGE)
        if JobState(job["state"]) not in ENDED:
            raise ApiError(409, f"job {job_id} is {job['state']}: interrupt it first")
        sup = self.supervisor
        # the record goes first, in one compare-and-set on its ended state: a resume racing
        # this delete either wins (409 here) or finds no job (404 there); what the engine
        # still holds is removed below, or by the supervisor's sweep of orphaned containers
        try:
            await asyncio.to_thread(self.jobs.delete, job_id)
        except KeyError:
            raise ApiError(404, f"no job {job_id}") from None
        except InvalidTransition as e:
            raise ApiError(409, f"job {job_id} changed meanwhile: {e}") from None
        await sup.remove_from_engine(job_id, job["spec"], job.get("node") or "")
        if int(job["spec"].get("workers") or 1) > 1:  # its own network, if still there
            with contextlib.suppress(Exception):
                await sup.runtime.remove_job_network(sup.s.instance, job_id)

        def unlink() -> None:  # file system work off the event loop
            for path in sup.saved_logs(job_id):
                path.unlink(missing_ok=True)

        await asyncio.to_thread(unlink)
        self.set_status(204)
        self.finish()


class JobEventsHandler(JobsBase):
    @authenticated
    async def get(self, job_id: str):
        job = await self.own_job(job_id)
        self.write_json({"id": job_id, "events": job["history"]})


class JobActionHandler(JobsBase):
    @authenticated
    async def post(self, job_id: str, action: str):
        job = await self.own_job(job_id, MANAGE)
        state = JobState(job["state"])
        jobs = self.jobs
        try:
            if action == "interrupt":
                if state is J.QUEUED:
                    try:
                        result = await asyncio.to_thread(
                            jobs.transition,
                            job_id,
                            J.INTERRUPTED,
                            reason="USER_INTERRUPT",
                            message="interrupted while queued",
                            expect=frozenset({J.QUEUED}),
                        )
                        return self.write_json(result)
                    except InvalidTransition:
                        # the scheduler placed it meanwhile: interrupt it as a started job
                        current = await asyncio.to_thread(jobs.get, job_id, False)
                        state = JobState(current["state"]) if current else state
                try:  # compare-and-set: only while the job can still be stopped
                    result = await asyncio.to_thread(
                        jobs.ask, job_id, "interrupt", states=INTERRUPTIBLE
                    )
                except InvalidTransition as e:
                    now = e.old.value if e.old else state.value
                    raise ApiError(409, f"job {job_id} is {now}: nothing to interrupt") from None
                self.supervisor.wake.set()
                return self.write_json(result, 202)
            elif action == "resume":
                if state is not J.INTERRUPTED:
                    raise ApiError(
                        409,
                        f"only an INTERRUPTED job can be resumed; this one is "
                        f"{state.value} (rerun makes a copy of any job)",
                    )
                result = await asyncio.to_thread(
                    jobs.transition,
                    job_id,
                    J.QUEUED,
                    reason="RESUMED",
                    message="resumed by its owner",
                    restarts=0,
                    hang_restarts=0,
                    exit_code=None,
                    expect=frozenset({J.INTERRUPTED}),
                )
                self.supervisor.wake.set()
            elif action == "rerun":
                # the copy belongs to the job's owner, also when an admin asks for it
                owner = {"name": job["owner"], "groups": job["groups"]}
                result = await JobsHandler.submit(self, owner, job["spec"])
                jobs_path = self.request.path.rsplit("/", 2)[0]
                self.set_header("Location", f"{jobs_path}/{result['id']}")
                return self.write_json(result, 201)
            elif action == "push":
                if state is not J.SYNC_FAILED:
                    raise ApiError(
                        409,
                        f"only a SYNC_FAILED job's push can be retried; this one is {state.value}",
                    )
                result = await self.supervisor.retry_push(job_id)
                return self.write_json(result, 200 if result["state"] != "SYNC_FAILED" else 502)
            else:
                raise ApiError(404, f"no action {action}")
        except InvalidTransition as e:
            raise ApiError(409, str(e)) from None
        except KeyError:  # deleted meanwhile (a concurrent DELETE): as if it never existed
            raise ApiError(404, f"no job {job_id}") from None
        self.write_json(result)


def parse_rank(text: str, job_id: str, workers: int) -> int:
    """A ``rank`` query parameter: 400 if it is no whole number, 404 if the job has no such
    worker (as for any part of a job that does not exist)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise ApiError(400, f"rank must be a whole number, not {text[:20]!r}", field="rank")
    if int(text) >= workers:
        plural = "s" if workers > 1 else ""
        raise ApiError(
            404, f"job {job_id} has no rank {int(text)}: it has {workers} worker{plural}"
        )
    return int(text)


class UsageHandler(JobsBase):
    @authenticated
    async def get(self):
        """Billed minutes: jobs (RUNNING to FINALIZING) and notebooks (RUNNING), per user."""
        me = self.require(READ)
        user = self.get_argument("user", me["name"])
        if user != me["name"] and not self.is_admin(me):
            raise ApiError(403, "only admins may read other users' usage")

        def both() -> tuple[dict, int]:  # one hop to a thread, not two
            return self.jobs.usage(user), self.records.billed_minutes(user)

        jobs, notebooks = await read(both)
        self.write_json(
            {
                "user": user,
                "jobs_billed_minutes": jobs["jobs_billed_minutes"],
                "notebooks_billed_minutes": notebooks,
                "billed_minutes": jobs["jobs_billed_minutes"] + notebooks,
            }
        )
