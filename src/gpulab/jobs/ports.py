"""A running job's ports as its viewers open them: who may open one, and where it answers.

Who: the job's owner, admins, and the users and groups the port is shared with
(``ports[].users``, ``ports[].groups``); anyone else is told there is no such job, the same
as for a job that does not exist. A port answers while its job is RUNNING, on rank 0: on the
job's own network for a distributed job, else on its owner's network where each user has one
(``network_isolation = "user"``), reached through :meth:`Runtime.reach` (on a Swarm, through
the notebook gateway). The proxy itself (HTTP and websockets, what a viewer may see) is the
service's (``service/api/ports.py``); its caps are here, as data: how many relays may be open
at once (:class:`PortRelays`), the largest answer and websocket message, how long an app may
take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..lifecycle import JobState
from ..runtime.base import EngineError, WorkloadGone
from .gang import workers_of
from .refusals import Busy, EngineFailed, NotFound, Unavailable, engine_refusal
from .spec import JobSpec

if TYPE_CHECKING:
    from ..settings import GpulabSettings
    from .supervisor import JobSupervisor

log = logging.getLogger("gpulab.ports")

#: seconds a job port's address is remembered (one engine look-up per miss)
TARGET_TTL = 10.0
_targets: dict[tuple[str, str], tuple[float, str, int]] = {}

# --- the relay's caps (the service's proxy reads them) ---------------------------------------
#: relays open at once, HTTP requests and websockets together: in all, and per user (the
#: proxy's HTTP client's own pool is as large as the total, so one user never takes it all)
MAX_RELAYS, MAX_RELAYS_PER_USER = 256, 32
#: the largest answer streamed (a model file, a dataset)
MAX_ANSWER_BYTES = 64 * 1024**3
#: the largest websocket message relayed either way (a larger one closes the relay, 1009)
MAX_WS_MESSAGE = 4 * 1024 * 1024
#: how long an app may take to answer (long polls included), and to connect, in seconds
REQUEST_TIMEOUT, CONNECT_TIMEOUT = 3600.0, 10.0
#: a viewer's websocket is pinged this often, and closed when no pong came this long after
WS_PING_INTERVAL, WS_PING_TIMEOUT = 30.0, 30.0


class PortRelays:
    """The relays to job ports open at once, HTTP requests and websockets together: at most
    ``per_user`` of one user's, ``total`` in all."""

    def __init__(self, per_user: int = MAX_RELAYS_PER_USER, total: int = MAX_RELAYS):
        self.per_user, self.total = per_user, total
        self.open: dict[str, int] = {}

    def take(self, user: str) -> None:
        """Count one more relay of ``user``'s; :class:`Busy` past either cap (nothing
        counted). Each one counted is given back once, when its relay ends (:meth:`give`)."""
        if self.open.get(user, 0) >= self.per_user:
            raise Busy(f"at most {self.per_user} requests and websockets to job ports at once")
        if sum(self.open.values()) >= self.total:
            raise Busy("too many requests to job ports at once: try again shortly")
        self.open[user] = self.open.get(user, 0) + 1

    def give(self, user: str) -> None:
        self.open[user] -= 1
        if not self.open[user]:
            del self.open[user]


#: the relays open in this service
RELAYS = PortRelays()


@dataclass(frozen=True)
class PortTarget:
    """Where a job's port answers, for one viewer."""

    host: str
    port: int
    #: whether the viewer owns the job (anyone else gets the port's pages sandboxed)
    owner: bool


async def open_port(
    sup: JobSupervisor,
    settings: GpulabSettings,
    job_id: str,
    name: str,
    *,
    viewer: str,
    groups: list[str] | None,
    admin: bool,
    path: str,
) -> PortTarget:
    """Where ``viewer`` (in ``groups``; ``admin``: with the admin scope) reaches the port
    ``name`` of job ``job_id``, its requests carrying ``path`` (the port's prefix). NotFound
    for a job or port the viewer may not open or that does not exist, Unavailable while the
    job is not RUNNING, EngineFailed when the engine cannot reach it now."""
    job = await asyncio.to_thread(sup.records.get, job_id, False)
    missing = NotFound(f"no job {job_id}")
    if job is None:
        raise missing
    spec = JobSpec.from_json(job["spec"])
    port = next((p for p in spec.ports if p.name == name), None)
    owner = job["owner"] == viewer
    if not (owner or admin or (port is not None and port.may_open(viewer, groups))):
        raise missing
    if port is None:
        names = ", ".join(p.name for p in spec.ports) or "none"
        raise NotFound(f"job {job_id} has no port {name!r} (its ports: {names})")
    if job.get("kind") == "array":
        raise Unavailable(f"job {job_id} is an array: each of its tasks opens its own ports")
    if job["state"] != JobState.RUNNING.value:
        raise Unavailable(f"job {job_id} is {job['state']}: its ports answer while it is RUNNING")
    host, number = await _where(sup, settings, job, port.name, port.port, path)
    return PortTarget(host, number, owner)


def forget(job_id: str, name: str) -> None:
    """The port did not answer: it may have moved, so look it up again next time."""
    _targets.pop((job_id, name), None)


async def rank0_network(sup: JobSupervisor, settings: GpulabSettings, job: dict) -> str:
    """The network rank 0 of ``job`` is on ("": the engine's default): a distributed job's
    own, else its owner's where each user has one."""
    if workers_of(job) > 1:
        return await sup.runtime.ensure_job_network(settings.instance, job["owner"], job["id"])
    if settings.network_isolation == "user":
        return await sup.runtime.ensure_user_network(settings.instance, job["owner"])
    return ""


async def _where(
    sup: JobSupervisor, settings: GpulabSettings, job: dict, name: str, number: int, path: str
) -> tuple[str, int]:
    key = (job["id"], name)
    hit = _targets.get(key)
    if hit and hit[0] > time.monotonic():
        return hit[1], hit[2]
    try:
        network = await rank0_network(sup, settings, job)
        host, port = await sup.runtime.reach(job["container"], network, path, number)
    except (WorkloadGone, EngineError) as e:  # gone meanwhile, or the engine failed
        log.info("job %s port %s not reachable: %s", job["id"], name, e)
        failed = f"job {job['id']}: port {name} cannot be reached now"
        refused = EngineFailed(failed) if isinstance(e, WorkloadGone) else engine_refusal(e, failed)
        raise refused from None
    _targets[key] = (time.monotonic() + TARGET_TTL, host, port)
    return host, port
