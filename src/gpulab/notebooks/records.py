"""Notebook records: the current state of each notebook and its timestamped history."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import selectinload

from ..billing import BILLED_STATES, billed_time
from ..db import Database, Notebook, NotebookEvent
from ..lifecycle import InvalidTransition, NotebookState, check_notebook_transition, utcnow
from ..live_push import STALE_S, ended_push, iso_seconds, push_busy, trim_live_pushes
from ..resources import Limits, Resources, format_memory, parse_memory
from ..statelog import state_change

S = NotebookState
log = logging.getLogger("gpulab.notebooks")
#: the newest events of a notebook's history that retention always keeps (what the pages show
#: of its recent starts and stops), however old
HISTORY_KEPT = 20
#: notebook states in which a notebook's container may hold CPUs, memory and GPUs
HOLDING_COMPUTE = frozenset({S.STARTING.value, S.RUNNING.value, S.STOPPING.value})


#: the longest cursor of a notebook list accepted (a user's and a server's names, encoded)
MAX_CURSOR = 1024


def notebook_cursor(nb: dict) -> str:
    """The cursor of a list's next page after ``nb`` (its last row): its user and server,
    URL-safe and opaque to readers (:func:`parse_notebook_cursor`)."""
    raw = json.dumps([nb["user"], nb["server"]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_notebook_cursor(text: str) -> tuple[str, str]:
    """(user, server) of a :func:`notebook_cursor`; ValueError if it is not one."""
    bad = ValueError("cursor is not one this service gave (a list's next page)")
    try:
        if len(text) > MAX_CURSOR:
            raise bad
        got = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode())
    except (ValueError, UnicodeDecodeError):
        raise bad from None
    if (
        not isinstance(got, list)
        or len(got) != 2
        or not all(isinstance(x, str) and len(x) <= 255 and "\x00" not in x for x in got)
    ):
        raise bad
    try:  # a lone surrogate is no name a database holds (nor can bind)
        for x in got:
            x.encode("utf-8")
    except UnicodeEncodeError:
        raise bad from None
    return got[0], got[1]


def history_cut(events, before: datetime, keep: int, limit: int) -> int:
    """How many of a notebook's oldest events (``events`` in time order, each with ``state``
    and ``at``) retention may delete: at most ``limit``, none of the ``keep`` newest, each
    older than ``before``, and the last one deleted in an unbilled state, so that no billed
    period crosses the cut (0: none may go)."""
    last = min(len(events) - keep, limit)
    for n in range(last, 0, -1):
        event = events[n - 1]
        if event.at < before and str(event.state) not in BILLED_STATES:
            return n
    return 0


def _billed(events, pruned_us: int, now: datetime) -> int:
    """Commenced minutes billed of one notebook: its kept history's billed time and that of
    the history retention deleted (pure)."""
    total = billed_time(events, now) + timedelta(microseconds=pruned_us)
    minutes, rest = divmod(total, timedelta(minutes=1))
    return minutes + (1 if rest else 0)


#: the most history events one notebook's cut deletes in one write transaction (what the
#: write lock is held for)
CUT_MAX = 1000


class LimitExceeded(Exception):
    """Starting this notebook would take the user's notebooks beyond their limits."""


def sum_resources(items) -> Resources:
    """The sum of notebooks' recorded resources ({cpus, memory, gpus} as in to_json)."""
    cpus, memory, gpus = 0.0, 0, 0.0
    for r in items:
        if not r:
            continue
        cpus += float(r.get("cpus", 0))
        memory += parse_memory(r["memory"]) if r.get("memory") else 0
        gpus += float(r.get("gpus", 0))
    return Resources(cpus=cpus, memory=memory, gpus=gpus)


def exceeds(held: Resources, new: Resources, limits: Limits) -> str:
    """Why ``new`` on top of ``held`` goes beyond ``limits`` ("" if it fits)."""
    over = []
    if held.cpus + new.cpus > limits.cpus + 1e-9:
        over.append(f"{held.cpus:g} CPUs in use + {new.cpus:g} > {limits.cpus:g}")
    if held.memory + new.memory > limits.memory:
        over.append(
            f"{format_memory(held.memory)} memory in use + {format_memory(new.memory)} > "
            f"{format_memory(limits.memory)}"
        )
    if held.gpus + new.gpus > limits.gpus + 1e-9:
        over.append(f"{held.gpus:g} GPUs in use + {new.gpus:g} > {limits.gpus:g}")
    if not over:
        return ""
    return (
        "your running notebooks together may hold at most "
        f"{limits.describe()}; this one would exceed that ({'; '.join(over)}): stop another "
        "notebook or ask for less"
    )


def _iso(t) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t else None


def notebook_json(nb: Notebook, history: bool = True) -> dict:
    """A notebook as the API shows it; ``history``: with its events (read for it)."""
    out = {
        "user": nb.user,
        "server": nb.server,
        "state": nb.state,
        "options": nb.options,
        "container": nb.container,
        "node": nb.node,
        "created": nb.created.isoformat().replace("+00:00", "Z"),
        "updated": nb.updated.isoformat().replace("+00:00", "Z"),
        "running_since": nb.running_since.isoformat().replace("+00:00", "Z")
        if nb.running_since
        else None,
        # the live pushes of its workspace, home and writable volumes (gpulab.live_push)
        "push_requested": _iso(nb.push_requested),
        "live_push": live_push_json(nb.live_push),
    }
    if history:
        out["history"] = [
            {
                "state": e.state,
                "at": e.at.isoformat().replace("+00:00", "Z"),
                "reason": e.reason,
                "message": e.message,
                "exit_code": e.exit_code,
            }
            for e in nb.events
        ]
    return out


def live_push_json(raw: dict | None) -> dict | None:
    """The last live push as the API shows it (None: none yet)."""
    if not raw:
        return None
    keys = ("running", "trigger", "started", "at", "ok", "message", "files", "bytes")
    return {k: raw.get(k) for k in keys}


def _logged(user: str, server: str, changes) -> None:
    """Log committed changes: (old state value or None, new state, reason, message, exit code)."""
    for old, new, reason, message, exit_code in changes:
        notebook = f"{user}/{server or '_default'}"
        state_change("notebook", notebook, user, old, new.value, reason, message, exit_code)


class NotebookRecords:
    """Reads and writes notebook states for one gpulab instance."""

    def __init__(self, db: Database, instance: str, observer: Callable[[dict], None] | None = None):
        self.db = db
        self.instance = instance
        #: told of every committed transition (the record after it), from the thread that
        #: made it: the hub's notices (notebooks/announce.py); it never fails a transition
        self.observer = observer

    def _find(self, s, user: str, server: str, lock: bool = False) -> Notebook | None:
        """The notebook with its events; ``lock``: its row locked for this transaction (a
        compare-and-set on PostgreSQL; SQLite's writers hold the database lock anyway)."""
        q = select(Notebook).where(
            Notebook.instance == self.instance, Notebook.user == user, Notebook.server == server
        )
        if lock:
            q = q.with_for_update(of=Notebook)
        return s.scalar(q.options(selectinload(Notebook.events)))

    def transition(
        self,
        user: str,
        server: str,
        state: NotebookState,
        *,
        reason: str = "",
        message: str = "",
        exit_code: int | None = None,
        expect: frozenset[NotebookState] | None = None,
        **fields,
    ) -> dict:
        """Move a notebook to ``state`` (checked against the lifecycle) and record why.

        ``expect``: the states the caller saw; any other raises InvalidTransition (someone
        else changed the notebook meanwhile: a compare-and-set, in the same transaction)."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if expect is not None:
                old = NotebookState(nb.state) if nb else None
                if old not in expect:
                    raise InvalidTransition("notebook", old, state)
            old = nb.state if nb else None
            nb = self._apply(s, nb, user, server, state, reason, message, exit_code, fields)
            s.flush()
            result = notebook_json(nb)
        _logged(user, server, [(old, state, reason, message, exit_code)])
        if self.observer is not None:
            try:
                self.observer(result)
            except Exception as e:  # a notice is a courtesy: never a fault of the notebook
                log.warning("%s/%s: notice not handed on: %s", user, server, e)
        return result

    def _apply(
        self,
        s,
        nb: Notebook | None,
        user: str,
        server: str,
        state: NotebookState,
        reason: str,
        message: str,
        exit_code: int | None,
        fields: dict,
    ) -> Notebook:
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
        return nb

    def start(
        self,
        user: str,
        server: str,
        resources: Resources,
        limits: Limits,
        *,
        reason: str = "",
        message: str = "",
        **fields,
    ) -> dict:
        """STARTING, admitted against the user's limits for all their notebooks together.

        The resources held by the user's other notebooks that hold compute (STARTING, RUNNING,
        STOPPING) plus this one's must stay within ``limits``. The check and the transition
        are one transaction, serialized per user, so two spawns at once cannot both take the
        last share. A refusal is recorded too (STARTING, then FAILED with LIMIT_EXCEEDED) and
        raised as :class:`LimitExceeded`.
        """
        with self.db.session() as s:
            self.db.serialize(s, "gpulab-notebooks", self.instance, user)
            others = s.scalars(
                select(Notebook.options).where(
                    Notebook.instance == self.instance,
                    Notebook.user == user,
                    Notebook.server != server,
                    Notebook.state.in_(HOLDING_COMPUTE),
                )
            ).all()
            held = sum_resources(o.get("resources") for o in others if o)
            why = exceeds(held, resources, limits)
            nb = self._find(s, user, server, lock=True)
            changes = [(nb.state if nb else None, S.STARTING, reason, message, None)]
            nb = self._apply(s, nb, user, server, S.STARTING, reason, message, None, fields)
            # a stop asked for an earlier life (and not carried out) is not this one's
            nb.stop_reason, nb.stop_message = "", ""
            if why:
                self._apply(s, nb, user, server, S.FAILED, "LIMIT_EXCEEDED", why, None, {})
                changes.append((S.STARTING.value, S.FAILED, "LIMIT_EXCEEDED", why, None))
            s.flush()
            result = notebook_json(nb)
        _logged(user, server, changes)
        if why:  # raised once the refusal is committed: the history keeps it
            raise LimitExceeded(why)
        return result

    def ask_stop(
        self, user: str, server: str, running_since: str, reason: str, message: str
    ) -> bool:
        """Set why the next stop happens, if the notebook is still the RUNNING life that the
        caller judged (``running_since`` as in :func:`notebook_json`): a compare-and-set, so a
        notebook stopped, or stopped and started again, meanwhile is left alone (False)."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is None or nb.state != S.RUNNING.value or _iso(nb.running_since) != running_since:
                return False
            nb.stop_reason, nb.stop_message = reason, message
            return True

    def withdraw_stop(self, user: str, server: str, reason: str) -> bool:
        """Clear a stop reason that is still ``reason`` (its stop did not happen)."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is None or nb.stop_reason != reason:
                return False
            nb.stop_reason, nb.stop_message = "", ""
            return True

    def running(self) -> list[dict]:
        """RUNNING notebooks: {user, server, state, running_since, options} (no history)."""
        with self.db.read() as s:
            q = select(Notebook).where(
                Notebook.instance == self.instance, Notebook.state == S.RUNNING.value
            )
            return [
                {
                    "user": nb.user,
                    "server": nb.server,
                    "state": nb.state,
                    "running_since": _iso(nb.running_since),
                    "options": nb.options or {},
                    "push_requested": _iso(nb.push_requested),
                }
                for nb in s.scalars(q)
            ]

    def request_push(self, user: str, server: str, stale_s: float = STALE_S) -> tuple[dict, bool]:
        """An owner's "push now" of a RUNNING notebook: (its record, whether it was asked
        now); False while one is asked or runs (one at a time; a mark older than ``stale_s``
        seconds, left by a process that died, does not count). InvalidTransition when it is
        not RUNNING; KeyError when there is no such notebook."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is None:
                raise KeyError(server)
            if nb.state != S.RUNNING.value:
                raise InvalidTransition("notebook's push", NotebookState(nb.state), S.RUNNING)
            now = utcnow()
            live = nb.live_push or {}
            asked = nb.push_requested.timestamp() if nb.push_requested else None
            began = iso_seconds(live.get("started"))
            busy = push_busy(now.timestamp(), asked, bool(live.get("running")), began, stale_s)
            if not busy:
                nb.push_requested = now
            s.flush()
            return notebook_json(nb), not busy

    def live_push_began(self, user: str, server: str, trigger: str) -> dict | None:
        """A live push starts, only while the notebook is RUNNING (its record; None: it is
        not, and its stop's push takes everything): the request is taken."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is None or nb.state != S.RUNNING.value:
                if nb is not None:
                    nb.push_requested = None
                return None
            nb.live_push = {
                **dict(nb.live_push or {}),
                "running": True,
                "trigger": trigger,
                "started": _iso(utcnow()),
            }
            nb.push_requested = None
            s.flush()
            return notebook_json(nb)

    def live_push_ended(
        self, user: str, server: str, ok: bool, message: str, files: int, nbytes: int
    ) -> None:
        """A live push ended: its outcome on the record and one event in its history (reason
        LIVE_PUSH or LIVE_PUSH_FAILED, in the state it is in). Never a state change."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is None:
                return
            now = utcnow()
            nb.live_push = ended_push(nb.live_push, _iso(now), ok, message, files, nbytes)
            reason = "LIVE_PUSH" if ok else "LIVE_PUSH_FAILED"
            nb.events.append(NotebookEvent(at=now, state=nb.state, reason=reason, message=message))
            trim_live_pushes(nb.events)

    def set_stop_reason(self, user: str, server: str, reason: str, message: str) -> None:
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is not None:
                nb.stop_reason, nb.stop_message = reason, message

    def set_node(self, user: str, server: str, node: str) -> None:
        """Where its workload is placed (a cluster): its volumes live on that node."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is not None:
                nb.node = node

    def take_stop_reason(self, user: str, server: str) -> tuple[str, str]:
        """The reason set by whoever asked for this stop (cleared), else a user's stop."""
        with self.db.session() as s:
            nb = self._find(s, user, server, lock=True)
            if nb is None or not nb.stop_reason:
                return ("STOP", "stop requested")
            why = (nb.stop_reason, nb.stop_message)
            nb.stop_reason, nb.stop_message = "", ""
            return why

    def get(self, user: str, server: str) -> dict | None:
        with self.db.read() as s:
            nb = self._find(s, user, server)
            return notebook_json(nb) if nb else None

    def state(self, user: str, server: str) -> NotebookState | None:
        nb = self.get(user, server)
        return NotebookState(nb["state"]) if nb else None

    def list(self, user: str | None = None) -> list[dict]:
        with self.db.read() as s:
            q = select(Notebook).where(Notebook.instance == self.instance)
            if user is not None:
                q = q.where(Notebook.user == user)
            q = q.options(selectinload(Notebook.events)).order_by(Notebook.user, Notebook.server)
            return [notebook_json(nb) for nb in s.scalars(q)]

    def page(
        self,
        user: str | None,
        limit: int,
        offset: int,
        labels: Mapping[str, str] | None = None,
        after: tuple[str, str] | None = None,
    ) -> tuple[list[dict], int]:
        """One page of :meth:`list` (by user, then server) and how many there are in all;
        ``labels``: only those whose options carry every one of these labels; ``after``:
        only those after this (user, server) (a cursor: :func:`parse_notebook_cursor`;
        ``offset`` then counts from there, the total still counts them all)."""
        with self.db.read() as s:
            where = [Notebook.instance == self.instance]
            if user is not None:
                where.append(Notebook.user == user)
            order = (Notebook.user, Notebook.server)
            # after the cursor's row in the database's own order (its collation), wherever
            # that row is now
            past = []
            if after is not None:
                user_after, server_after = after
                past.append(
                    or_(
                        Notebook.user > user_after,
                        and_(Notebook.user == user_after, Notebook.server > server_after),
                    )
                )
            if labels:  # labels live in the options' JSON: filtered here, on ids and options

                def labelled(*extra) -> list[int]:
                    return [
                        nb_id
                        for nb_id, options in s.execute(
                            select(Notebook.id, Notebook.options)
                            .where(*where, *extra)
                            .order_by(*order)
                        )
                        if all(
                            ((options or {}).get("labels") or {}).get(k) == v
                            for k, v in labels.items()
                        )
                    ]

                ids = labelled(*past)
                total = len(ids) if not past else len(labelled())
                window = select(Notebook).where(Notebook.id.in_(ids[offset : offset + limit]))
            else:
                total = s.scalar(select(func.count()).select_from(Notebook).where(*where))
                window = select(Notebook).where(*where, *past).order_by(*order)
                window = window.limit(limit).offset(offset)
            q = window.options(selectinload(Notebook.events)).order_by(*order)
            return [notebook_json(nb) for nb in s.scalars(q)], total

    def billed_minutes(self, user: str) -> int:
        """RUNNING time of the user's notebooks, per commenced minute (per notebook)."""
        with self.db.read() as s:
            rows = (
                s.connection()
                .execute(
                    select(NotebookEvent.notebook_id, NotebookEvent.state, NotebookEvent.at)
                    .join(Notebook, Notebook.id == NotebookEvent.notebook_id)
                    .where(Notebook.instance == self.instance, Notebook.user == user)
                    .order_by(NotebookEvent.notebook_id, NotebookEvent.id)
                )
                .all()
            )
            pruned = self._pruned(s, Notebook.user == user)
        per_notebook: dict[int, list] = {}
        for row in rows:
            per_notebook.setdefault(row.notebook_id, []).append(row)
        now = utcnow()
        return sum(
            _billed(per_notebook.get(nb_id, []), us, now)
            for nb_id, (_, us) in pruned.items()
            if nb_id in per_notebook or us
        )

    def billed_minutes_of(self, users: list[str]) -> dict[str, int]:
        """:meth:`billed_minutes` of each of ``users`` (a page of them), in one query."""
        if not users:
            return {}
        with self.db.read() as s:
            rows = (
                s.connection()
                .execute(
                    select(
                        Notebook.user,
                        NotebookEvent.notebook_id,
                        NotebookEvent.state,
                        NotebookEvent.at,
                    )
                    .join(Notebook, Notebook.id == NotebookEvent.notebook_id)
                    .where(Notebook.instance == self.instance, Notebook.user.in_(users))
                    .order_by(NotebookEvent.notebook_id, NotebookEvent.id)
                )
                .all()
            )
            pruned = self._pruned(s, Notebook.user.in_(users))
        per_notebook: dict[int, list] = {}
        for row in rows:
            per_notebook.setdefault(row.notebook_id, []).append(row)
        now = utcnow()
        out = dict.fromkeys(users, 0)
        for nb_id, (user, us) in pruned.items():
            if nb_id in per_notebook or us:
                out[user] += _billed(per_notebook.get(nb_id, []), us, now)
        return out

    def _pruned(self, s, which) -> dict[int, tuple[str, int]]:
        """{notebook id: (user, billed microseconds of its deleted history)} of ``which``."""
        return {
            nb_id: (user, us or 0)
            for nb_id, user, us in s.execute(
                select(Notebook.id, Notebook.user, Notebook.billed_pruned_us).where(
                    Notebook.instance == self.instance, which
                )
            )
        }

    # --- retention of histories -----------------------------------------------------------

    def prune_history(self, before: datetime, keep: int = HISTORY_KEPT, limit: int = 1000) -> int:
        """Delete up to ``limit`` history events older than ``before`` of notebooks with
        more than ``keep`` events, never one of a notebook's ``keep`` newest; how many went.

        Each notebook loses an oldest part of its history that ends with an event in an
        unbilled state (STOPPED, FAILED ...: no billed period runs across the cut), and the
        billed time of that part is added to its ``billed_pruned_us`` in the same
        transaction: its usage (:meth:`billed_minutes`) is the same to the microsecond before
        and after. The notebooks are picked by a read (no write lock); each one's cut is
        made in a short write transaction of its own, its row locked and its history read
        again there (a compare-and-set: events added since the pick only move the cut)."""
        with self.db.read() as s:
            candidates = list(
                s.scalars(
                    select(NotebookEvent.notebook_id)
                    .join(Notebook, Notebook.id == NotebookEvent.notebook_id)
                    .where(Notebook.instance == self.instance)
                    .group_by(NotebookEvent.notebook_id)
                    .having(func.count() > keep, func.min(NotebookEvent.at) < before)
                    .order_by(NotebookEvent.notebook_id)
                )
            )
        gone = 0
        for nb_id in candidates:
            if gone >= limit:
                break
            most = min(limit - gone, CUT_MAX)
            # a notebook with nothing to cut (its old part ends in a billed state: a long
            # run) costs a read, not a write transaction at every sweep
            with self.db.read() as s:
                if not history_cut(self._history(s, nb_id), before, keep, most):
                    continue
            gone += self._prune_one(nb_id, before, keep, most)
        return gone

    @staticmethod
    def _history(s, nb_id: int) -> list:
        return s.execute(
            select(NotebookEvent.id, NotebookEvent.state, NotebookEvent.at)
            .where(NotebookEvent.notebook_id == nb_id)
            .order_by(NotebookEvent.at, NotebookEvent.id)
        ).all()

    def _prune_one(self, nb_id: int, before: datetime, keep: int, limit: int) -> int:
        with self.db.session() as s:
            locked = s.scalar(select(Notebook.id).where(Notebook.id == nb_id).with_for_update())
            if locked is None:
                return 0
            events = self._history(s, nb_id)
            cut = history_cut(events, before, keep, limit)
            if not cut:
                return 0
            prefix = events[:cut]
            carried = billed_time(prefix, before)  # closed periods only: no `now` in it
            s.execute(
                update(Notebook)
                .where(Notebook.id == nb_id)
                .values(
                    billed_pruned_us=Notebook.billed_pruned_us
                    + carried // timedelta(microseconds=1)
                )
            )
            s.execute(delete(NotebookEvent).where(NotebookEvent.id.in_([e.id for e in prefix])))
            return cut

    def users_after(self, after: str, limit: int) -> list[str]:
        """Up to ``limit`` users with a notebook record, by name, after ``after``."""
        with self.db.read() as s:
            return list(
                s.scalars(
                    select(Notebook.user)
                    .where(Notebook.instance == self.instance, Notebook.user > after)
                    .group_by(Notebook.user)
                    .order_by(Notebook.user)
                    .limit(limit)
                )
            )

    def user_rows(self, users: list[str]) -> dict[str, dict]:
        """For each of ``users`` with a notebook: ``notebooks`` and ``notebooks_running``."""
        if not users:
            return {}
        out: dict[str, dict] = {}
        with self.db.read() as s:
            for user, state, n in s.execute(
                select(Notebook.user, Notebook.state, func.count())
                .where(Notebook.instance == self.instance, Notebook.user.in_(users))
                .group_by(Notebook.user, Notebook.state)
            ):
                row = out.setdefault(user, {"notebooks": 0, "notebooks_running": 0})
                row["notebooks"] += n
                if state == NotebookState.RUNNING.value:
                    row["notebooks_running"] += n
        return out

    def page_after(self, after: tuple[str, str] | None, limit: int) -> list[dict]:
        """Up to ``limit`` notebooks by user, then server, after ``after`` (user, server;
        None from the first): a page that a cursor continues (without their histories)."""
        with self.db.read() as s:
            q = select(Notebook).where(Notebook.instance == self.instance)
            if after is not None:
                user, server = after
                q = q.where(
                    or_(Notebook.user > user, and_(Notebook.user == user, Notebook.server > server))
                )
            q = q.order_by(Notebook.user, Notebook.server).limit(limit)
            return [notebook_json(nb, history=False) for nb in s.scalars(q)]

    def counts(self) -> dict[str, int]:
        """How many notebooks are in each state (one grouped query)."""
        with self.db.read() as s:
            rows = s.execute(
                select(Notebook.state, func.count())
                .where(Notebook.instance == self.instance)
                .group_by(Notebook.state)
            ).all()
        return {state: n for state, n in rows}

    def running_longer_than(self, seconds: float) -> list[dict]:
        cutoff = utcnow() - timedelta(seconds=seconds)
        with self.db.read() as s:
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
