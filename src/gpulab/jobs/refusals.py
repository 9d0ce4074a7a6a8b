"""What gpulab refuses of a job request, by kind: each kind carries the HTTP status the
adapters answer it with (:func:`gpulab.service.base.answer_refusals`). The jobs domain's
functions (:mod:`~gpulab.jobs.actions`, :mod:`~gpulab.jobs.logs`, :mod:`~gpulab.jobs.exec`)
raise them; none of them knows HTTP beyond that number. The engine's failures have their own
two (:func:`engine_refusal`): 503 while it does not answer, 502 when it failed a call."""

from __future__ import annotations

from ..runtime.base import EngineError, EngineUnreachable


class JobRefused(Exception):
    """A request gpulab refuses: ``message`` says why, ``field`` names the bad input (if one
    is to blame); ``status`` is the HTTP status the adapters answer it with."""

    status = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class Invalid(JobRefused):
    """The request itself is wrong, or can never be met (400)."""

    status = 400


class NotAllowed(JobRefused):
    """The caller may not ask for this (403)."""

    status = 403


class NotFound(JobRefused):
    """No such job (404): also one that went meanwhile."""

    status = 404


class Conflict(JobRefused):
    """The job's state, or the owner's queue, forbids it now (409)."""

    status = 409


class Busy(JobRefused):
    """Too many of these are open at once, the caller's or everyone's (429)."""

    status = 429


class EngineFailed(JobRefused):
    """The container engine could not do what was asked (502)."""

    status = 502


class Unavailable(JobRefused):
    """Not now: what was asked answers only in another state of the job, or the container
    engine does not answer (503)."""

    status = 503


def engine_refusal(e: EngineError, failed: str = "") -> JobRefused:
    """What a request is answered when the engine failed its call ``e``: an engine that gave
    no answer is :class:`Unavailable` (503), in words that name it ("Docker engine at
    unix:///var/run/docker.sock is unreachable: Connection refused"); one that failed the
    call is :class:`EngineFailed` (502), ``failed`` saying what could not be done (else the
    engine's own words)."""
    if isinstance(e, EngineUnreachable):
        return Unavailable(str(e))
    return EngineFailed(failed or f"the container engine failed: {e.detail}")
