"""Notebook records: the current state of each notebook and its timestamped history."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from .db import Database, Notebook, NotebookEvent
from .lifecycle import NotebookState, check_notebook_transition, utcnow


def notebook_json(nb: Notebook) -> dict:
    return {
        "user": nb.user,
        "server": nb.server,
        "state": nb.state,
        "options": nb.options,
        "container": nb.container,
        "created": nb.created.isoformat().replace("+00:00", "Z"),
        "updated": nb.updated.isoformat().replace("+00:00", "Z"),
        "running_since": nb.running_since.isoformat().replace("+00:00", "Z")
        if nb.running_since
        else None,
        "history": [
            {
                "state": e.state,
                "at": e.at.isoformat().replace("+00:00", "Z"),
                "reason": e.reason,
                "message": e.message,
                "exit_code": e.exit_code,
            }
            for e in nb.events
        ],
    }


class NotebookRecords:
    """Reads and writes notebook states for one gpulab instance."""

    def __init__(self, db: Database, instance: str):
        self.db = db
        self.instance = instance

    def _find(self, s, user: str, server: str) -> Notebook | None:
        return s.scalar(
            select(Notebook)
            .where(
                Notebook.instance == self.instance, Notebook.user == user, Notebook.server == server
            )
            .options(selectinload(Notebook.events))
        )

    def transition(
        self,
        user: str,
        server: str,
        state: NotebookState,
        *,
        reason: str = "",
        message: str = "",
        exit_code: int | None = None,
        **fields,
    ) -> dict:
        """Move a notebook to ``state`` (checked against the lifecycle) and record why."""
        with self.db.session() as s:
            nb = self._find(s, user, server)
            old = NotebookState(nb.state) if nb else None
            check_notebook_transition(old, state)
            now = utcnow()
            if nb is None:
                nb = Notebook(instance=self.instance, user=user, server=server, state=state.value)
                s.add(nb)
            for key, value in fields.items():
                setattr(nb, key, value)
            nb.state = state.value
            nb.updated = now
            nb.running_since = now if state is NotebookState.RUNNING else None
            nb.events.append(
                NotebookEvent(
                    at=now, state=state.value, reason=reason, message=message, exit_code=exit_code
                )
            )
            s.flush()
            return notebook_json(nb)

    def set_stop_reason(self, user: str, server: str, reason: str, message: str) -> None:
        with self.db.session() as s:
            nb = self._find(s, user, server)
            if nb is not None:
                nb.stop_reason, nb.stop_message = reason, message

    def take_stop_reason(self, user: str, server: str) -> tuple[str, str]:
        """The reason set by whoever asked for this stop (cleared), else a user's stop."""
        with self.db.session() as s:
            nb = self._find(s, user, server)
            if nb is None or not nb.stop_reason:
                return ("STOP", "stop requested")
            why = (nb.stop_reason, nb.stop_message)
            nb.stop_reason, nb.stop_message = "", ""
            return why

    def get(self, user: str, server: str) -> dict | None:
        with self.db.session() as s:
            nb = self._find(s, user, server)
            return notebook_json(nb) if nb else None

    def state(self, user: str, server: str) -> NotebookState | None:
        nb = self.get(user, server)
        return NotebookState(nb["state"]) if nb else None

    def list(self, user: str | None = None) -> list[dict]:
        with self.db.session() as s:
            q = select(Notebook).where(Notebook.instance == self.instance)
            if user is not None:
                q = q.where(Notebook.user == user)
            q = q.options(selectinload(Notebook.events)).order_by(Notebook.user, Notebook.server)
            return [notebook_json(nb) for nb in s.scalars(q)]

    def billed_minutes(self, user: str) -> int:
        """RUNNING time of the user's notebooks, per commenced minute (per notebook)."""
        from .jobs.billing import billed_minutes

        with self.db.session() as s:
            q = select(Notebook).where(Notebook.instance == self.instance, Notebook.user == user)
            q = q.options(selectinload(Notebook.events))
            now = utcnow()
            return sum(billed_minutes(nb.events, now) for nb in s.scalars(q))

    def running_longer_than(self, seconds: float) -> list[dict]:
        cutoff = utcnow() - timedelta(seconds=seconds)
        with self.db.session() as s:
            q = select(Notebook).where(
                Notebook.instance == self.instance,
                Notebook.state == NotebookState.RUNNING.value,
                Notebook.running_since < cutoff,
            )
            return [
                {
                    "user": nb.user,
                    "server": nb.server,
                    "user_options": nb.user_options or {},
                    "auto_restart": bool((nb.options or {}).get("auto_restart")),
                }
                for nb in s.scalars(q)
            ]
