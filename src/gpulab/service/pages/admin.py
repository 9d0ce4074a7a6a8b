"""The admin page: every GPU and what holds it (whole, or the slots of a shared one), every
notebook and job, and a table of users with their limits, quotas and billed minutes."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict

from ...disk_quota import human
from ...gpus.usage import usage_of
from ...jobs.overview import usage_of as user_usage
from ...lifecycle import JobState, NotebookState
from ...resources import format_memory
from ..base import authenticated
from .base import ACTIVE_STATES, PageHandler


def holders(rows: list[dict], slots: int) -> list[dict]:
    """A device's ledger rows, one entry per workload: a whole device, or the slots of a
    shared one that the workload holds and the fraction of the GPU they make."""
    out: dict[str, dict] = {}
    for a in sorted(rows, key=lambda a: a["share"]):
        entry = out.setdefault(a["workload"], {**a, "slots": []})
        if a["share"]:
            entry["slots"].append(a["share"])
    for entry in out.values():
        n = len(entry["slots"])
        entry["fraction"] = (round(n / slots, 4) if slots else n) if n else None
    return list(out.values())


class AdminPage(PageHandler):
    @authenticated
    async def get(self):
        self.require_admin()
        s = self.settings["gpulab"]
        ledger = self.supervisor.ledger
        allocations = await asyncio.to_thread(ledger.allocations)
        notebooks = await asyncio.to_thread(self.records.list, None)
        jobs = await asyncio.to_thread(self.jobs.list, None)
        jobs.sort(key=lambda j: j["submitted"] or "", reverse=True)

        by_device: dict[str, list[dict]] = defaultdict(list)
        for a in allocations:
            by_device[a["device"]].append(a)
        job_ids = {j["id"] for j in jobs}
        # what each device does now (NVML, this host's; none on a Swarm or without a driver)
        reader = self.supervisor.ctx.gpu_usage
        usages = await asyncio.to_thread(reader) if reader is not None else []
        gpus = []
        for dev in ledger.devices:
            slots = ledger.slots(dev)
            held = holders(by_device.pop(dev.key, []), slots)
            used = sum(len(a["slots"]) for a in held) if held and held[0]["slots"] else 0
            now = usage_of(usages, [dev.key])
            activity = (
                {
                    "utilization": now[0].utilization,
                    "memory_used": human(now[0].memory_used),
                    "memory_total": human(now[0].memory_total),
                }
                if now
                else None
            )
            gpus.append(
                {
                    "device": dev.to_json(),
                    "held": held,
                    "slots": slots,
                    "used": used,
                    "activity": activity,
                }
            )
        # rows of devices no longer configured (kept so that nothing is hidden)
        for dev_id, rows in sorted(by_device.items()):
            gpus.append(
                {
                    "device": {"id": dev_id, "model": "(not configured)", "memory": ""},
                    "held": holders(rows, 0),
                    "slots": 0,
                    "used": 0,
                    "activity": None,
                }
            )
        for g in gpus:
            for a in g["held"]:
                parts = a["workload"].split("/")
                a["job_id"] = parts[-1] if a["kind"] == "job" and parts[-1] in job_ids else None
                a["notebook"] = "/".join(parts[-2:]) if a["kind"] == "notebook" else None

        users = await asyncio.to_thread(self.user_table, s, notebooks, jobs, allocations)
        disk_of: Counter = Counter()  # bytes each user's volumes and clones hold on nodes
        for b in await asyncio.to_thread(self.supervisor.disk.bookings):
            disk_of[b["owner"]] += b["bytes"]
        for u in users:
            u["disk_held"] = human(disk_of.get(u["name"], 0))
            quota = s.disk_quota_for(u["name"], u["groups"])
            u["disk_quota"] = human(quota) if quota is not None else "∞"
        self.render_page(
            "admin.html",
            gpus=gpus,
            gpus_total=len(ledger.devices),
            inventory=self.supervisor.runtime.inventory,
            gpus_busy=len({a["device"] for a in allocations}),
            notebooks=notebooks,
            jobs=jobs[:50],
            jobs_total=len(jobs),
            users=users,
            settings=s,
            default_limits=s.limits_for("", []),
            format_memory=format_memory,
        )

    def user_table(self, s, notebooks, jobs, allocations) -> list[dict]:
        names = sorted({n["user"] for n in notebooks} | {j["owner"] for j in jobs})
        groups_of: dict[str, list[str]] = {}
        for j in jobs:  # newest first: a job remembers its owner's groups when submitted
            groups_of.setdefault(j["owner"], j["groups"])
        gpus_of: Counter = Counter()  # a shared device's slot counts as its fraction
        for a in allocations:
            gpus_of[a["owner"]] += a["gpus"]
        rows = []
        for name in names:
            groups = groups_of.get(name, [])
            mine = [j for j in jobs if j["owner"] == name]
            quota = s.quota_for(name, groups)
            limits = s.limits_for(name, groups)
            usage = user_usage(self.jobs, self.records, name)
            rows.append(
                {
                    "name": name,
                    "groups": groups,
                    "quota": quota,
                    "limits": limits,
                    "limit_memory": format_memory(limits.memory),
                    "notebooks": sum(1 for n in notebooks if n["user"] == name),
                    "notebooks_running": sum(
                        1
                        for n in notebooks
                        if n["user"] == name and n["state"] == NotebookState.RUNNING.value
                    ),
                    "jobs": len(mine),
                    "jobs_active": sum(1 for j in mine if j["state"] in ACTIVE_STATES),
                    "jobs_queued": sum(1 for j in mine if j["state"] == JobState.QUEUED.value),
                    "gpus_held": round(gpus_of.get(name, 0), 4),
                    "usage": usage,
                }
            )
        return rows
