"""The hub's periodic reconciliation of notebook records, the GPU ledger and the engine.

A hub killed in the middle of a start or a stop leaves a record in STARTING or STOPPING that
nobody will finish, a sync helper container (with store credentials) that nobody will
remove, and GPUs booked for a container that no longer runs. The hub process runs one
reconciliation pass every ``notebook_reconcile_interval`` seconds (and one at its first
spawn or poll):

- records: a STARTING, STOPPING or DELETING record that no spawner of this hub process is
  working on, unchanged for a while, is settled from what the engine says (a start: RUNNING
  if its container runs, else FAILED; a stop: its container stopped first if it still runs,
  then SYNC_FAILED, whose data stays in its volume for a retried push; a delete: ERROR, to
  be deleted again);
- sync helpers of notebooks that are not starting or stopping in this process are removed
  (with the secret files they hold), and so is what dead helpers left apart from themselves
  (``Runtime.remove_helper_leftovers``: a Swarm's secrets that no helper uses any more);
- GPUs are released from notebooks that neither run a container nor are in transit;
- on a cluster, a RUNNING notebook whose node has been down or drained for ``LOST_AFTER``
  seconds becomes ERROR with reason NODE_LOST: its service is removed, and once the manager
  has forgotten its task its GPUs are released (the node's volume, with whatever the notebook
  wrote since its start, stays on that node); and a notebook gateway that had to be made anew
  gets the running notebooks' routes back.

:func:`repairs` is the pure decision, tested without an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from ..disk_ledger import DiskLedger
from ..lifecycle import LOST_AFTER, InvalidTransition, NotebookState, utcnow
from ..names import L_ROUTE, L_WORKLOAD, notebook_workload_id
from ..runtime import EngineError

log = logging.getLogger("gpulab.notebooks")
S = NotebookState
IN_TRANSIT = frozenset({S.STARTING.value, S.STOPPING.value, S.DELETING.value})
#: seconds a record in transit may stay unchanged with nobody working on it (the default of
#: GpulabSettings.notebook_stale_after)
STALE_AFTER = 30.0
#: the same for the service's push retries (one push: at most the helper's 10 minutes)
PUSH_RETRY_STALE_AFTER = 900.0


@dataclass(frozen=True)
class Repair:
    user: str
    server: str
    expect: NotebookState
    state: NotebookState
    reason: str
    message: str


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def repairs(
    records: list[dict],
    running: set[str],
    busy: set[str],
    now: datetime,
    instance: str,
    stale_after: float = STALE_AFTER,
) -> tuple[list[Repair], list[dict]]:
    """The transitions that settle stale STARTING / STOPPING / DELETING records, and the
    records whose container must be stopped first (a stop the engine did not confirm).

    ``running``: workload ids with a running container; ``busy``: workload ids a spawner of
    this process is starting, stopping or deleting. A record in transit that nobody here
    works on, unchanged for ``stale_after`` seconds, is stale; a push retry (the service's,
    STOPPING with reason PUSH_RETRY) only after PUSH_RETRY_STALE_AFTER."""
    out, to_stop = [], []
    for nb in records:
        if nb["state"] not in IN_TRANSIT:
            continue
        workload = notebook_workload_id(instance, nb["user"], nb["server"])
        age = (now - _at(nb["updated"])).total_seconds()
        last = (nb.get("history") or [{}])[-1].get("reason", "")
        patience = PUSH_RETRY_STALE_AFTER if last == "PUSH_RETRY" else stale_after
        if workload in busy or age < patience:
            continue
        state = S(nb["state"])
        up = workload in running
        if state is S.STARTING and up:
            new, reason, msg = S.RUNNING, "RECOVERED", "found running after a hub restart"
        elif state is S.STARTING:
            new, reason, msg = S.FAILED, "HUB_RESTART", "the hub restarted while it started"
        elif state is S.DELETING:
            new, reason = S.ERROR, "DELETE_FAILED"
            msg = "the delete was cut short (a hub restart); delete it again"
        elif up:
            to_stop.append(nb)  # a stop the engine did not confirm: stopped first
            continue
        else:
            new, reason = S.SYNC_FAILED, "STOP_CUT_SHORT"
            msg = "its stop was cut short (hub restart, engine fault); data kept: retry the push"
        out.append(Repair(nb["user"], nb["server"], state, new, reason, msg))
    return out, to_stop


class NotebookReconciler:
    """One per hub process (per instance); the spawners share it."""

    def __init__(self, settings, records, ledger, runtime, datasets=None):
        self.s, self.records, self.ledger, self.runtime = settings, records, ledger, runtime
        #: the hub's dataset cache (gpulab/data/datasets.py): each pass reaps the helpers of
        #: cache pulls (either process's) whose process holds no live claim
        self.datasets = datasets
        self.busy: set[str] = set()  # workloads a spawner of this process is starting/stopping
        self._task: asyncio.Task | None = None
        self._lost_since: dict[str, float] = {}  # workload -> when its node was first seen lost

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception:
                log.exception("notebook reconciliation failed")
            await asyncio.sleep(self.s.notebook_reconcile_interval)

    async def pass_once(self) -> dict:
        instance = self.s.instance
        records = await asyncio.to_thread(self.records.list, None)
        try:
            containers = await self.runtime.labelled(instance, "notebook")
            helpers = await self.runtime.labelled(instance, "sync-helper")
        except EngineError as e:
            log.warning("notebooks not reconciled (engine): %s", e)
            return {}
        lost, removed_again = await self._settle_lost(records, containers)
        running = {
            c.labels.get(L_WORKLOAD, "")
            for c in containers
            if c.running and c.labels.get(L_WORKLOAD, "") not in lost | removed_again
        }
        with contextlib.suppress(Exception):  # a gateway made anew: routes back
            put = await self.runtime.restore_routes(instance)
            if put:
                log.warning("notebook gateway made anew; routes put back: %s", ", ".join(put))
        fixed = [f"{w} RUNNING->ERROR (NODE_LOST)" for w in lost]
        settle, to_stop = repairs(
            records, running, set(self.busy), utcnow(), instance, self.s.notebook_stale_after
        )
        for nb in to_stop:
            log.warning("stopping %s/%s: its stop was not confirmed", nb["user"], nb["server"])
            with contextlib.suppress(Exception):  # confirmed (or not) on the next pass
                await self.runtime.stop(nb["container"], 10)
        for r in settle:
            with contextlib.suppress(InvalidTransition):  # it moved meanwhile: fine
                await asyncio.to_thread(
                    self.records.transition,
                    r.user,
                    r.server,
                    r.state,
                    reason=r.reason,
                    message=r.message,
                    expect=frozenset({r.expect}),
                )
                fixed.append(f"{r.user}/{r.server} {r.expect.value}->{r.state.value}")
        if fixed:
            log.warning("settled notebook records left by an earlier hub: %s", ", ".join(fixed))
        # helpers: only while a start or a stop is on; the service's push retries are STOPPING
        transit = {
            notebook_workload_id(instance, nb["user"], nb["server"])
            for nb in await asyncio.to_thread(self.records.list, None)
            if nb["state"] in IN_TRANSIT
        }
        notebook_prefix = notebook_workload_id(instance, "", "").rsplit("/", 2)[0] + "/"
        removed = []
        for h in helpers:
            workload = h.labels.get(L_WORKLOAD, "")
            if not workload.startswith(notebook_prefix) or workload in self.busy:
                continue
            if workload in transit:
                continue
            if await self.runtime.remove(h.id):
                removed.append(workload)
        if removed:
            log.warning("removed orphaned sync helpers of %s", ", ".join(removed))
        if self.datasets is not None:
            try:
                await self.datasets.reap_helpers(helpers)
            except Exception as e:  # noqa: BLE001 - the next pass tries again
                log.warning("dataset cache pulls not reaped: %s", e)
        try:  # and what dead helpers left apart from themselves (a Swarm's secrets)
            left = await self.runtime.remove_helper_leftovers(instance)
        except EngineError as e:
            log.warning("what dead helpers left is not removed yet: %s", e)
            left = []
        if left:
            log.warning("removed what dead sync helpers left behind: %s", ", ".join(left))
        live = running | transit | set(self.busy)
        gone = await asyncio.to_thread(
            self.ledger.reconcile, live, "notebook", self.s.gpu_reconcile_grace
        )
        if gone:
            log.warning("released GPUs of notebooks that run no container: %s", ", ".join(gone))
        # disk bookings of notebooks deleted (or forgotten) whose release was cut short; read
        # now: a record is written before its first booking
        keep = {
            notebook_workload_id(instance, nb["user"], nb["server"])
            for nb in await asyncio.to_thread(self.records.list, None)
            if nb["state"] != NotebookState.DELETED.value
        } | set(self.busy)
        disk = DiskLedger(self.ledger.db, instance)
        await asyncio.to_thread(disk.release_all_but, keep, notebook_prefix)
        return {"records": fixed, "helpers": removed, "gpus": gone}

    async def _settle_lost(self, records: list[dict], containers) -> tuple[set[str], set[str]]:
        """Running notebooks whose node is lost (a cluster only): ERROR NODE_LOST, their
        workload removed, then their GPUs released. Returns their workload ids, and those of
        notebooks settled so by an earlier pass whose workload is removed only now."""
        if not self.ledger.clustered:  # one host: its node is never lost
            return set(), set()
        try:
            nodes = {n.hostname: n for n in await self.runtime.nodes()}
        except EngineError as e:
            log.warning("cluster nodes not read: %s", e)
            return set(), set()
        by_workload = {c.labels.get(L_WORKLOAD, ""): c for c in containers}
        now, out, again = time.monotonic(), set(), set()
        for nb in records:
            workload = notebook_workload_id(self.s.instance, nb["user"], nb["server"])
            c = by_workload.get(workload)
            if c is not None and workload not in self.busy and _lost_earlier(nb):
                # settled NODE_LOST by an earlier pass whose removal failed: again, until the
                # engine confirms it gone; its GPUs stay booked until then
                await self._remove_lost(c, workload)
                again.add(workload)
                continue
            n = nodes.get(c.node) if c else None
            healthy = n is not None and n.ready and n.active
            if nb["state"] != S.RUNNING.value or c is None or workload in self.busy or healthy:
                self._lost_since.pop(workload, None)
                continue
            found = await self.runtime.state(c.name)
            if found is None or not found.lost:
                continue
            if now - self._lost_since.setdefault(workload, now) < LOST_AFTER:
                continue
            msg = (
                f"{found.error}: the notebook is gone with it; what it wrote since it started "
                "stays in that node's volume, the workspace in object storage is its last push"
            )
            try:
                await asyncio.to_thread(
                    self.records.transition,
                    nb["user"],
                    nb["server"],
                    S.ERROR,
                    reason="NODE_LOST",
                    message=msg,
                    expect=frozenset({S.RUNNING}),
                )
            except InvalidTransition:
                continue  # stopped meanwhile: the stop settles it
            self._lost_since.pop(workload, None)
            log.error("notebook %s/%s: NODE_LOST: %s", nb["user"], nb["server"], found.error)
            await self._remove_lost(c, workload)
            out.add(workload)
        return out, again

    async def _remove_lost(self, c, workload: str) -> None:
        """Remove a lost notebook's workload, then release its GPUs: they go back once the
        manager has forgotten its task (remove() returns then). An engine error leaves them
        booked and comes up; the next pass tries again (the record is ERROR NODE_LOST)."""
        await self.runtime.remove(c.name)
        await self.runtime.unreach(c.labels.get(L_ROUTE, ""))
        released = await asyncio.to_thread(self.ledger.release, workload)
        if released:
            log.warning("released GPUs %s of lost notebook %s", ", ".join(released), workload)


def _lost_earlier(nb: dict) -> bool:
    """A record an earlier pass settled ERROR NODE_LOST (its last event says so)."""
    history = nb.get("history") or ()
    return (
        nb["state"] == S.ERROR.value and bool(history) and history[-1].get("reason") == "NODE_LOST"
    )
