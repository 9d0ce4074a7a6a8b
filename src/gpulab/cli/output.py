"""The ``gpulab`` command line's output: tables, times and a job's details (see
:mod:`gpulab.cli`).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from .client import ENDED

# --- output -------------------------------------------------------------------------------------


def out(text: str = "") -> None:
    print(text, flush=True)


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def print_json(obj: Any) -> None:
    out(json.dumps(obj, indent=2))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    rows = [["" if c is None else str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    for row in [list(headers), *rows]:
        out("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _parse_time(iso: str | None) -> datetime | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None


def when(iso: str | None) -> str:
    t = _parse_time(iso)
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h}h" if h else f"{d}d"
    if h:
        return f"{h}h{m:02d}m" if m else f"{h}h"
    if m:
        return f"{m}m{s:02d}s" if s else f"{m}m"
    return f"{s}s"


def runtime(job: dict) -> str:
    """How long it has run: since running_since, or (ended, with its history) from its first
    RUNNING to its end; "-" when unknown (an ended job listed without history)."""
    start = _parse_time(job.get("running_since"))
    end = None
    if job.get("state") in ENDED:
        history = job.get("history") or []
        runs = [_parse_time(e.get("at")) for e in history if e.get("state") == "RUNNING"]
        start = runs[0] if runs else None
        end = _parse_time(history[-1].get("at")) if history else None
    if start is None:
        return "-"
    return duration(((end or datetime.now(UTC)) - start).total_seconds())


def workers_of(job: dict) -> int:
    """How many workers (containers) a job runs, from its API JSON: ``spec.workers`` (the
    submission's field, absent or 1 for a one-container job; more for a distributed job)."""
    try:
        return max(1, int((job.get("spec") or {}).get("workers") or 1))
    except (TypeError, ValueError):
        return 1


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else "-"


def _exit(job: dict) -> str:
    return "-" if job.get("exit_code") is None else str(job["exit_code"])


def _gpus(job: dict) -> str:
    """GPUs of the job in all: "1"; a distributed job's total, then workers x each: "4 (2x2)"."""
    gpus = ((job.get("spec") or {}).get("resources") or {}).get("gpus")
    if gpus is None:
        return "-"
    n = workers_of(job)
    return str(gpus) if n == 1 else f"{n * int(gpus)} ({n}x{gpus})"


def job_table(jobs: list[dict], owners: bool = False) -> None:
    headers = ["ID", "NAME", *(["OWNER"] if owners else []), "STATE", "GPUS", "SUBMITTED"]
    headers += ["RUNTIME", "EXIT", "MESSAGE"]
    rows = [
        [
            j["id"],
            j.get("name"),
            *([j.get("owner")] if owners else []),
            j.get("state"),
            _gpus(j),
            when(j.get("submitted")),
            runtime(j),
            _exit(j),
            j.get("message") or "",
        ]
        for j in jobs
    ]
    table(headers, rows)


def events_table(events: list[dict]) -> None:
    table(
        ["TIME", "KIND", "STATE", "REASON", "EXIT", "MESSAGE"],
        [
            [
                when(e.get("at")),
                e.get("kind") or "transition",
                e.get("state") or "",
                e.get("reason") or "",
                "-" if e.get("exit_code") is None else e["exit_code"],
                e.get("message") or "",
            ]
            for e in events
        ],
    )


def _env_text(name: str, value) -> str:
    if isinstance(value, dict):  # a secret: its reference, never a value
        return f"{name}=<secret {value.get('secret')}>"
    return f"{name}={value}"


def workers_table(job: dict) -> None:
    """One line per worker (rank) of a job: its container, node and devices."""
    table(
        ["RANK", "CONTAINER", "NODE", "DEVICES"],
        [
            [
                w.get("rank"),
                w.get("container") or "-",
                w.get("node") or "-",
                ",".join(w.get("devices") or []) or "-",
            ]
            for w in job.get("workers") or []
        ],
    )


def _counts(counts: dict) -> str:
    return ", ".join(f"{n} {state}" for state, n in counts.items())


def _array_fields(job: dict, spec: dict) -> list[tuple[str, Any]]:
    """A job array's line (its tasks and their states), or a task's (its array)."""
    if job.get("kind") == "array":
        text = f"{spec.get('completions')}, at most {spec.get('parallelism')} at once"
        if job.get("task_counts"):
            text += f": {_counts(job['task_counts'])}"
        return [("Tasks", text + " (below)")]
    if job.get("kind") == "task":
        task = spec.get("task") or {}
        params = json.dumps(task.get("parameters") or {})
        return [
            (
                "Array",
                f"{job.get('array')}, task {job.get('task_index')} of {spec.get('completions')}",
            ),
            ("Parameters", params),
        ]
    return []


def tasks_table(tasks: list[dict]) -> None:
    """One line per task of a job array: its index, id, state, exit code, restarts and
    parameters."""
    table(
        ["INDEX", "ID", "STATE", "EXIT", "RESTARTS", "PARAMETERS", "MESSAGE"],
        [
            [
                t.get("index"),
                t.get("id"),
                t.get("state"),
                _exit(t),
                t.get("restarts", 0),
                json.dumps(t.get("parameters") or {}) if t.get("parameters") else "-",
                t.get("message") or "",
            ]
            for t in tasks
        ],
    )


#: what a job asks of its GPUs beyond a count, shown when it asks (spec key, title)
_WANT_FIELDS = (("gpu_model", "GPU model"), ("node_pool", "Node pool"))


def job_details(job: dict, hub_url: str = "") -> None:
    spec = job.get("spec") or {}
    res = spec.get("resources") or {}
    n = workers_of(job)
    each = ""
    if n > 1:
        total = n * int(res.get("gpus") or 0)
        each = f" per worker ({n} workers: {total} GPU in all)"
    image = spec.get("image") or ""
    if spec.get("framework"):
        image += f" ({spec['framework']} {spec.get('version') or ''})".replace(" )", ")")
    argv = [*(spec.get("command") or []), *(spec.get("args") or [])]
    command = shlex.join(argv)
    hang = spec.get("hang_restart") or {}
    fields = [
        ("ID", job.get("id")),
        ("Name", job.get("name")),
        ("Owner", job.get("owner")),
        ("State", job.get("state")),
        ("Reason", job.get("reason")),
        ("Message", job.get("message")),
        ("Exit code", _exit(job)),
        ("Image", image),
        ("Command", command),
        (
            "Resources",
            f"{res.get('gpus', '-')} GPU, {_num(res.get('cpus'))} CPU, "
            f"{res.get('memory', '-')} memory"
            + (f" (flavor {spec['flavor']})" if spec.get("flavor") else "")
            + each,
        ),
        *[(title, spec[key]) for key, title in _WANT_FIELDS if spec.get(key)],
        ("Workers", f"{n} (a distributed job: ranks below)" if n > 1 else n),
        *_array_fields(job, spec),
        ("Devices", ",".join(job.get("devices") or []) or "-"),
        ("Volumes", ", ".join(spec.get("volumes") or []) or "-"),
        ("Env", ", ".join(_env_text(k, v) for k, v in (spec.get("env") or {}).items()) or "-"),
        ("Labels", ", ".join(f"{k}={v}" for k, v in (spec.get("labels") or {}).items()) or "-"),
        ("Timeout", duration(float(spec["timeout"])) if spec.get("timeout") else "-"),
        (
            "Deleted",
            f"{duration(float(spec['auto_delete_after']))} after it ends"
            if isinstance(spec.get("auto_delete_after"), int | float)
            else "as the site keeps jobs",
        ),
        ("Retries", f"{job.get('restarts', 0)} of {spec.get('retries', 0)} used"),
        (
            "Hang restart",
            f"after {duration(float(hang.get('period') or 0))} without progress "
            f"({job.get('hang_restarts', 0)} so far)"
            if hang.get("enabled")
            else "off",
        ),
        (
            "Preemptible",
            ("yes, ends when preempted" if spec.get("terminate_after_preemption") else "yes")
            if spec.get("preemptible")
            else "no",
        ),
        ("Priority", spec.get("priority")),
        ("Submitted", when(job.get("submitted"))),
        ("Running since", when(job.get("running_since"))),
        ("Runtime", runtime(job)),
        ("Billed minutes", job.get("billed_minutes")),
        ("Billed GPU minutes", job.get("billed_gpu_minutes")),
        (
            "Ports",
            ", ".join(f"{p['name']} {hub_url}{p['url']}" for p in job.get("ports") or []),
        ),
        *_live_push_fields(job, spec),
    ]
    width = max(len(k) for k, _ in fields) + 1
    for key, value in fields:
        out(f"{key + ':':<{width}} {'-' if value in (None, '') else value}")
    if n > 1 and job.get("workers"):
        out()
        workers_table(job)
    if job.get("tasks"):
        out()
        tasks_table(job["tasks"])
    if job.get("history"):
        out()
        events_table(job["history"])


def _live_push_fields(job: dict, spec: dict) -> list[tuple[str, object]]:
    """A job's own sync interval and its last live push (nothing when it has neither)."""
    fields: list[tuple[str, object]] = []
    interval = spec.get("sync_interval")
    if isinstance(interval, int | float):
        fields.append(("Live push", f"every {duration(float(interval))}" if interval else "off"))
    last = job.get("live_push")
    if last:
        if last.get("running"):
            text = f"running since {when(last.get('started'))}"
        else:
            text = f"{when(last.get('at'))}: {last.get('message') or '-'}"
        fields.append(("Last live push", text))
    return fields
