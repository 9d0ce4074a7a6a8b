"""What the service shows of a user's workloads across both domains: a user's billed minutes
(the usage API, the home page and the admin's table alike: :func:`usage_of`).

Here because the jobs' records are this domain's; the notebooks' records are handed in
(:class:`NotebookReads`: the domains never import each other). What is billed is
:mod:`gpulab.billing`'s rule. Blocking: it reads the database (run it off the event loop).
"""

from __future__ import annotations

from typing import Protocol

from ..billing import user_usage
from .records import JobRecords


class NotebookReads(Protocol):
    """What is read of the notebooks' records
    (:class:`gpulab.notebooks.records.NotebookRecords`)."""

    def list(self, user: str | None = None) -> list[dict]: ...

    def billed_minutes(self, user: str) -> int: ...


def usage_of(jobs: JobRecords, notebooks: NotebookReads, user: str) -> dict:
    """``user``'s billed minutes, as the usage API answers them: ``user``, their jobs', their
    notebooks' and the two together (:func:`gpulab.billing.user_usage`)."""
    minutes = jobs.usage(user)["jobs_billed_minutes"]
    return {"user": user, **user_usage(minutes, notebooks.billed_minutes(user))}
