"""REST API of training jobs (under /services/gpulab/api/jobs).

Permissions are JupyterHub RBAC scopes: ``custom:gpulab:jobs:read`` to read one's own jobs,
``custom:gpulab:jobs:manage`` to submit and act on them; admins (the hub's admin flag,
``admin:servers`` or ``custom:gpulab:admin``) see and act on everyone's. Another user's job is
a 404: its existence is not revealed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from tornado.iostream import StreamClosedError

from ..errors import FieldError
from ..jobs.records import ACTIVE, ENDED
from ..jobs.scheduler import Quota, can_ever_fit, quota_for
from ..jobs.spec import parse_job_spec
from ..lifecycle import InvalidTransition, JobState
from ..runtime.docker import NotFound
from .app_base import ApiError, BaseHandler, authenticated

J = JobState
READ, MANAGE = "custom:gpulab:jobs:read", "custom:gpulab:jobs:manage"


def _quota(d) -> Quota:
    return Quota(gpus=d.get("gpus"), jobs=d.get("jobs"))


class JobsBase(BaseHandler):
    @property
    def supervisor(self):
        return self.settings["supervisor"]

    @property
    def jobs(self):
        return self.supervisor.records

    def require(self, scope: str) -> dict:
        me = self.current_user
        scopes = set(me.get("scopes", ()))
        if self.is_admin(me) or scope in scopes or (scope == READ and MANAGE in scopes):
            return me
        raise ApiError(403, f"your token lacks the scope {scope}")

    async def own_job(self, job_id: str, scope: str = READ) -> dict:
        me = self.require(scope)
        job = await asyncio.to_thread(self.jobs.get, job_id)
        if job is None or (job["owner"] != me["name"] and not self.is_admin(me)):
            raise ApiError(404, f"no job {job_id}")
        return job

    def body(self) -> dict:
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
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
        want_all = self.get_argument("all", "false").lower() == "true"
        if (user != me["name"] or want_all) and not self.is_admin(me):
            raise ApiError(403, "only admins may list other users' jobs")
        states = None
        if self.get_argument("state", ""):
            states = {s.strip().upper() for s in self.get_argument("state").split(",")}
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
        rows = await asyncio.to_thread(
            self.jobs.list, None if want_all else user, states, labels or None
        )
        self.write_json({"jobs": rows})

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
        host_gpus = len(self.supervisor.ledger.devices)
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
            )
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None
        quota = quota_for(
            user,
            groups,
            _quota(s.job_quota),
            {u: _quota(q) for u, q in s.user_job_quotas.items()},
            {g: _quota(q) for g, q in s.group_job_quotas.items()},
        )
        why = can_ever_fit(spec.resources.gpus, host_gpus, quota, spec.preemptible)
        if why:
            raise ApiError(400, why, field="resources.gpus")
        mine = await asyncio.to_thread(
            self.jobs.list, user, {J.QUEUED.value} | {x.value for x in ACTIVE}
        )
        if len(mine) >= s.max_queued_jobs:
            raise ApiError(
                409,
                f"you have {len(mine)} jobs queued or running; the most is "
                f"{s.max_queued_jobs}: wait for some to end",
            )
        job = await asyncio.to_thread(self.jobs.create, user, spec.to_json(), spec.name, groups)
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
        runtime = sup.runtime
        with contextlib.suppress(NotFound):
            await runtime.run(
                runtime.client.remove_container, sup.container_name(job_id), force=True
            )
        from ..jobs.spec import JobSpec

        for vol in sup.volumes(job_id, JobSpec.from_json(job["spec"])):
            await runtime.remove_volume(vol.docker_volume)
        sup.log_file(job_id).unlink(missing_ok=True)
        await asyncio.to_thread(self.jobs.delete, job_id)
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
                if state in ACTIVE and state is not J.FINALIZING:
                    await asyncio.to_thread(jobs.update, job_id, request="interrupt")
                    result = await asyncio.to_thread(jobs.get, job_id)
                    self.supervisor.wake.set()
                    return self.write_json(result, 202)
                raise ApiError(409, f"job {job_id} is {state.value}: nothing to interrupt")
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
        self.write_json(result)


class JobLogsHandler(JobsBase):
    @authenticated
    async def get(self, job_id: str):
        """The job's output; ?follow=true streams it until the job's container ends."""
        await self.own_job(job_id)
        follow = self.get_argument("follow", "false").lower() in ("true", "1", "yes")
        sup = self.supervisor
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        info = await sup.runtime.inspect_container(sup.container_name(job_id))
        waiting = {J.QUEUED.value, J.INITIALIZING.value, J.PENDING.value}
        while follow and info is None:
            # following a job that has not started yet: wait for its container (or its end)
            job = await asyncio.to_thread(self.jobs.get, job_id, False)
            if job is None or job["state"] not in waiting:
                break
            await asyncio.sleep(0.5)
            info = await sup.runtime.inspect_container(sup.container_name(job_id))
        if info is None:
            path = sup.log_file(job_id)
            if path.exists():
                self.write(await asyncio.to_thread(path.read_bytes))
            return self.finish()
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        name = sup.container_name(job_id)
        client = sup.runtime.client

        def pump():
            try:
                for chunk in client.logs(
                    name, stdout=True, stderr=True, stream=True, follow=follow
                ):
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
            except Exception:  # the container went away: end of stream
                pass
            loop.call_soon_threadsafe(queue.put_nowait, None)

        loop.run_in_executor(sup.runtime.shared_executor(), pump)
        try:
            while (chunk := await queue.get()) is not None:
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            return
        self.finish()


class UsageHandler(JobsBase):
    @authenticated
    async def get(self):
        """Billed minutes: jobs (RUNNING to FINALIZING) and notebooks (RUNNING), per user."""
        me = self.require(READ)
        user = self.get_argument("user", me["name"])
        if user != me["name"] and not self.is_admin(me):
            raise ApiError(403, "only admins may read other users' usage")
        jobs = await asyncio.to_thread(self.jobs.usage, user)
        notebooks = await asyncio.to_thread(self.records.billed_minutes, user)
        self.write_json(
            {
                "user": user,
                "jobs_billed_minutes": jobs["jobs_billed_minutes"],
                "notebooks_billed_minutes": notebooks,
                "billed_minutes": jobs["jobs_billed_minutes"] + notebooks,
            }
        )
