"""Commands in a running job, for its owner or an admin: an exec (a command run to its end,
its output and exit code answered) and a shell (an interactive terminal, a TTY exec). Both go
through the runtime, so they work on every backend.

The rules, once for the REST API and the CLI behind it: only while the job is RUNNING, in the
rank asked for (rank 0 by default); commands run as the job's user (1000:100), never one of the
caller's choosing, within the container's limits; a few at once per user and in all (each
holds an engine connection and a thread for its whole length); each recorded in the job's
events (who, and what command) before it runs, and logged without the command (it may hold
secrets). Terminal content is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shlex
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

from ..bounds import MiB, shown
from ..checks import json_object
from ..errors import FieldError
from ..lifecycle import JobState
from ..names import rank_name
from ..runtime.base import EngineError, ExecSession, WorkloadGone
from .gang import rank_of
from .refusals import Busy, Conflict, Invalid, engine_refusal
from .spec import JobSpecError, parse_command

if TYPE_CHECKING:
    from .supervisor import JobSupervisor

log = logging.getLogger("gpulab.jobs.exec")

#: seconds an exec may run: its default, and the most a caller may ask for
DEFAULT_EXEC_TIMEOUT, MAX_EXEC_TIMEOUT = 60.0, 600.0
#: the most output an exec answers (stdout and stderr together); the rest is dropped
MAX_EXEC_OUTPUT = 1 * MiB
#: concurrent execs, and shells, per user and in all
MAX_EXECS_PER_USER, MAX_EXECS = 4, 32
MAX_SHELLS_PER_USER, MAX_SHELLS = 4, 32
#: characters of a command kept in the job's event
EVENT_COMMAND_CHARS = 200


class OpenCounts:
    """How many of ``what`` (execs, shells) each user holds open: at most ``per_user`` for a
    user, ``total`` in all."""

    def __init__(self, per_user: int, total: int, what: str):
        self.per_user, self.total, self.what = per_user, total, what
        self.open: dict[str, int] = {}

    @contextlib.contextmanager
    def held(self, user: str) -> Iterator[None]:
        """One more of ``user``'s while it lasts; :class:`Busy` over either cap."""
        if self.open.get(user, 0) >= self.per_user:
            raise Busy(f"you have {self.per_user} {self.what} open; wait for one to end")
        if sum(self.open.values()) >= self.total:
            raise Busy(f"the service has {self.total} {self.what} open; try again later")
        self.open[user] = self.open.get(user, 0) + 1
        try:
            yield
        finally:
            self.open[user] -= 1
            if not self.open[user]:
                del self.open[user]


#: the execs and the shells open in this process
EXECS = OpenCounts(MAX_EXECS_PER_USER, MAX_EXECS, "execs")
SHELLS = OpenCounts(MAX_SHELLS_PER_USER, MAX_SHELLS, "shells")


def parse_exec(body: dict) -> tuple[list[str], float]:
    """(argv, time-out) of an exec request, or :class:`Invalid` naming the field at fault."""
    unknown = sorted(set(body) - {"command", "timeout"})
    if unknown:
        raise Invalid(
            f"unknown field {shown(unknown[0])}: an exec takes command and timeout",
            field=str(unknown[0]),
        )
    if "command" not in body:
        raise Invalid("command is required: a list of strings or one shell line", field="command")
    try:  # the same rules and caps as a job's command
        command = parse_command(body["command"])
    except JobSpecError as e:
        raise Invalid(str(e), field="command") from None
    timeout = body.get("timeout", DEFAULT_EXEC_TIMEOUT)
    if timeout is None:
        timeout = DEFAULT_EXEC_TIMEOUT
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_EXEC_TIMEOUT
    ):
        raise Invalid(
            f"timeout must be a number of seconds above 0 and at most {MAX_EXEC_TIMEOUT:g}, "
            f"not {shown(timeout)}",
            field="timeout",
        )
    return command, float(timeout)


def command_text(command: str | list[str]) -> str:
    """The command as the job's events show it (a shell line as given, a list quoted as a
    shell would), on one line, cut at EVENT_COMMAND_CHARS."""
    text = command if isinstance(command, str) else shlex.join(command)
    text = " ".join(text.split())
    if len(text) > EVENT_COMMAND_CHARS:
        text = text[: EVENT_COMMAND_CHARS - 1] + "…"
    return text


def _target(sup: JobSupervisor, job: dict, rank: str) -> tuple[str, str]:
    """The container a command runs in (``rank`` of a distributed job, as the caller wrote
    it) and how the events name it ("" for a one-container job), if the job is RUNNING;
    else :class:`Conflict`."""
    if job.get("kind") == "array":
        raise Conflict(f"job {job['id']} is an array: it runs in its tasks, run it in one of them")
    if job["state"] != JobState.RUNNING.value:
        raise Conflict(f"job {job['id']} is {job['state']}: only a RUNNING job can run commands")
    workers = int(job["spec"].get("workers") or 1)
    r = rank_of(rank, job["id"], workers)
    return rank_name(sup.container_name(job["id"]), r), (f" (rank {r})" if workers > 1 else "")


async def run(sup: JobSupervisor, job: dict, rank: str, body: bytes | None, by: str) -> dict:
    """Run the command that ``body`` (the request, JSON) asks for in the job's ``rank``, for
    ``by``, to its end: its exit code (None on time-out), output and whether it was cut."""
    name, where = _target(sup, job, rank)
    try:
        raw = json_object(body)
    except FieldError as e:
        raise Invalid(str(e), field=e.field) from None
    command, timeout = parse_exec(raw)
    job_id = job["id"]
    with EXECS.held(by):
        message = f"exec by {by}{where}: {command_text(raw['command'])}"
        await asyncio.to_thread(sup.records.note, job_id, "exec", "EXEC", message)
        log.info("exec by %s in job %s", by, job_id)  # not the command: it may hold secrets
        try:
            code, output, truncated = await sup.runtime.exec_run(
                name, command, timeout, MAX_EXEC_OUTPUT
            )
        except WorkloadGone:
            raise Conflict(f"job {job_id} is no longer running") from None
        except EngineError as e:
            log.warning("exec in job %s failed: %s", job_id, type(e).__name__)
            raise engine_refusal(e, "the container engine could not run the command") from None
    return {
        "exit_code": code,
        "output": output.decode("utf-8", "replace"),
        "truncated": truncated,
        "timed_out": code is None,
    }


@contextlib.asynccontextmanager
async def shell(
    sup: JobSupervisor,
    job: dict,
    rank: str,
    by: str,
    terminal: Callable[[], tuple[int, int]],
) -> AsyncIterator[ExecSession]:
    """An interactive terminal in the job's ``rank`` for ``by``, while the block lasts.
    ``terminal()`` gives its size (cols, rows) once the job and the rank were found right:
    the caller's own checks of its request run there, after these."""
    name, where = _target(sup, job, rank)
    cols, rows = terminal()
    job_id = job["id"]
    with SHELLS.held(by):
        message = f"shell opened by {by}{where}"
        await asyncio.to_thread(sup.records.note, job_id, "shell", "SHELL", message)
        log.info("shell opened by %s in job %s", by, job_id)
        try:
            session = await sup.runtime.exec_session(name, cols, rows)
        except WorkloadGone:
            raise Conflict(f"job {job_id} is no longer running") from None
        except EngineError as e:
            log.warning("shell in job %s failed: %s", job_id, type(e).__name__)
            raise engine_refusal(e, "the container engine could not open a shell") from None
        try:
            yield session
        finally:
            session.close()
