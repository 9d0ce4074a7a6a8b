"""The ``gpulab`` command line's commands, each ``cmd_*(args, client) -> exit code`` (see
:mod:`gpulab.cli`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .client import (
    ENDED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    NOT_STARTED,
    POLL,
    Client,
    CliError,
    normalize_url,
    write_config,
)
from .output import (
    events_table,
    job_details,
    job_table,
    note,
    out,
    print_json,
    table,
    workers_of,
)
from .secrets import add_run_fields

# --- commands -----------------------------------------------------------------------------------


def _pairs(items: list[str] | None, what: str, flag: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} takes {what}=VALUE, not {item!r}", EXIT_USAGE)
        result[key] = value
    return result


def build_submission(args: argparse.Namespace) -> dict:
    if not args.command:
        raise CliError(
            "a job needs a command: gpulab job run [options] -- CMD [ARGS...]", EXIT_USAGE
        )
    body: dict[str, Any] = {"command": list(args.command)}
    for key in (
        "name",
        "framework",
        "version",
        "image",
        "image_pull_policy",
        "image_pull_secret",
        "flavor",
    ):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    resources = {
        k: v
        for k, v in (("gpus", args.gpu), ("cpus", args.cpu), ("memory", args.memory))
        if v is not None
    }
    if resources:
        body["resources"] = resources
    for key in ("gpu_model", "node_pool"):
        if getattr(args, key, None) is not None:
            body[key] = getattr(args, key)
    if getattr(args, "workers", None) is not None:
        body["workers"] = args.workers
    for key in ("completions", "parallelism"):
        if getattr(args, key, None) is not None:
            body[key] = getattr(args, key)
    if getattr(args, "parameters", None) is not None:
        body["parameters"] = _parameters(args.parameters)
    if args.env:
        body["env"] = _pairs(args.env, "NAME", "-e/--env")
    if args.label:
        body["labels"] = _pairs(args.label, "KEY", "-l/--label")
    if args.volume:
        body["volumes"] = list(args.volume)
    if args.timeout is not None:
        body["timeout"] = _duration_value(args.timeout)
    if args.retries is not None:
        body["retries"] = args.retries
    if args.hang_restart is not None:
        body["hang_restart"] = {"enabled": True, "period": _duration_value(args.hang_restart)}
    if args.preemptible:
        body["preemptible"] = True
    if args.terminate_after_preemption:
        body["terminate_after_preemption"] = True
    if args.auto_delete_after is not None:
        body["auto_delete_after"] = _duration_value(args.auto_delete_after)
    if args.sync_interval is not None:
        body["sync_interval"] = _duration_value(args.sync_interval)
    if args.priority is not None:
        body["priority"] = args.priority
    add_run_fields(args, body)
    notify = {
        k: v
        for k, v in (("webhook", args.notify_webhook), ("email", args.notify_email))
        if v is not None
    }
    if args.notify_on is not None:
        if not notify:
            raise CliError("--notify-on needs --notify-webhook or --notify-email", EXIT_USAGE)
        notify["on"] = [e.strip() for e in args.notify_on.split(",") if e.strip()]
    if notify:
        body["notify"] = notify
    return body


def _parameters(path: str) -> Any:
    """The parameter sets of a job array, read from a JSON file (``-``: stdin); what they
    hold is the service's to check (a 400 names the set and key at fault)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise CliError(f"--parameters: cannot read {path}: {e.strerror or e}", EXIT_USAGE) from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise CliError(f"--parameters: {path} is not JSON: {e}", EXIT_USAGE) from None


def _duration_value(text: str) -> str | int | float:
    """Seconds as a number ("90" -> 90), anything else ("2h") as the API parses it."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _log_params(follow: bool, rank: int | None) -> dict[str, str]:
    params = {"follow": "true" if follow else "false"}
    if rank is not None:
        params["rank"] = str(rank)
    return params


class _ShownLines:
    """What was shown of a distributed job's merged log (every rank's, each line prefixed
    ``[rank K]``), line by line. A later read of it (the saved log after the end, or the
    engine's again after a restart) can interleave the ranks otherwise than the live stream
    did, so a count of bytes cannot say what is new: a line is new when this read has it more
    times than all that was shown so far."""

    def __init__(self) -> None:
        self.shown: Counter[bytes] = Counter()
        self.seen: Counter[bytes] = Counter()
        self.rest = b""

    def clear(self) -> None:
        self.shown.clear()

    def start(self) -> None:
        self.seen.clear()
        self.rest = b""

    def _new(self, lines: list[bytes]) -> bytes:
        out = []
        for line in lines:
            self.seen[line] += 1
            if self.seen[line] > self.shown[line]:
                self.shown[line] += 1
                out.append(line + b"\n")
        return b"".join(out)

    def feed(self, chunk: bytes) -> bytes:
        *lines, self.rest = (self.rest + chunk).split(b"\n")
        return self._new(lines)

    def end(self) -> bytes:
        rest, self.rest = self.rest, b""
        return self._new([rest]) if rest else b""


def follow_logs(client: Client, job_id: str, rank: int | None = None) -> dict:
    """Write the job's output to stdout as it comes, until the job ends; returns the job.
    ``rank``: only that worker's of a distributed job (default: every rank's, prefixed).

    The service streams a container's log while it runs; before that (QUEUED...) there is
    nothing to stream, so this waits. A retried job runs again in the same container, whose
    log then starts with what was already shown: that much is skipped (for every rank of a
    distributed job, line by line: see :class:`_ShownLines`). A job put back in the queue
    (preempted) gets a new container, whose log is shown from its start.
    """
    shown = 0
    lines = _ShownLines()
    sink = sys.stdout.buffer
    while True:
        job = client.json("GET", f"/jobs/{job_id}")
        state = job["state"]
        if state in NOT_STARTED:
            if state == "QUEUED":
                shown = 0
                lines.clear()
            time.sleep(POLL)
            continue
        ended = state in ENDED
        merged = rank is None and workers_of(job) > 1
        received = 0
        lines.start()
        for chunk in client.stream(f"/jobs/{job_id}/logs", _log_params(not ended, rank)):
            if merged:
                chunk, start = lines.feed(chunk), 0
            else:
                start = max(shown - received, 0)
                received += len(chunk)
            if start < len(chunk):
                sink.write(chunk[start:])
                sink.flush()
        if merged and (tail := lines.end()):
            sink.write(tail)
            sink.flush()
        shown = max(shown, received)
        if ended:
            return job
        time.sleep(POLL)


def _follow(client: Client, job_id: str, rank: int | None = None) -> dict:
    try:
        return follow_logs(client, job_id, rank)
    except KeyboardInterrupt:
        raise CliError(
            f"stopped following job {job_id}, which keeps running "
            f"(`gpulab job stop {job_id}` interrupts it)",
            EXIT_INTERRUPTED,
        ) from None


def _end_line(job: dict) -> str:
    text = f"job {job['id']} {job['state']}"
    if job.get("message"):
        text += f": {job['message']}"
    return text


def _job_id(job_id: str) -> str:
    if not re.fullmatch(r"[a-z0-9]+", job_id or ""):
        raise CliError(f"{job_id!r} is not a job id (such as j1a2b3c4d5e6f)", EXIT_USAGE)
    return job_id


def cmd_login(args: argparse.Namespace) -> int:
    url = (
        getattr(args, "url", None)
        or os.environ.get("GPULAB_URL")
        or os.environ.get("JUPYTERHUB_URL")
    )
    if not url:
        raise CliError("gpulab login needs --url https://your-hub", EXIT_USAGE)
    url = normalize_url(url)
    token = args.token
    if token in (None, "-"):
        if token == "-" or not sys.stdin.isatty():
            token = sys.stdin.readline().strip()
        else:
            token = getpass.getpass("API token (from the hub's Token page): ").strip()
    if not token:
        raise CliError("no token given", EXIT_USAGE)
    client = Client(url, token)
    if not args.no_verify:
        usage = client.json("GET", "/usage")
        who = f" as {usage.get('user')}" if isinstance(usage, dict) else ""
    else:
        who = ""
    path = write_config(url, token)
    note(f"logged in to {url}{who}; saved to {path}")
    return EXIT_OK


def cmd_job_run(args: argparse.Namespace, client: Client) -> int:
    body = build_submission(args)
    job = client.json("POST", "/jobs", json=body, ok=(201,))
    if not args.follow:
        print_json(job) if args.output == "json" else out(job["id"])
        return EXIT_OK
    if job.get("kind") == "array":  # its output is its tasks': waits for it to end
        note(
            f"job array {job['id']} ({job['name']}) submitted; waiting for its tasks to end "
            f"(`gpulab job get {job['id']}` lists them, `gpulab job logs TASK` shows one's output)"
        )
        try:
            end = _wait_ended(client, job["id"])
        except KeyboardInterrupt:
            raise CliError(
                f"stopped waiting for job {job['id']}, which keeps running", EXIT_INTERRUPTED
            ) from None
        note(_end_line(end))
        if args.output == "json":
            print_json(end)
        return EXIT_OK if end["state"] == "DONE" else EXIT_FAILED
    note(
        f"job {job['id']} ({job['name']}) submitted; following its output (Ctrl-C stops "
        "following, not the job)"
    )
    end = _follow(client, job["id"])
    note(_end_line(end))
    if args.output == "json":
        print_json(end)
    return EXIT_OK if end["state"] == "DONE" else EXIT_FAILED


def _list_params(args: argparse.Namespace) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = []
    if getattr(args, "all", False):
        params.append(("all", "true"))
    if getattr(args, "user", None):
        params.append(("user", args.user))
    return params


def _next_params(answer: dict) -> list[tuple[str, str]] | None:
    """The query of a list's ``next`` page (its cursor, limit and filters), as the service
    wrote it; None at the end. Only the query is read: the path is the one asked already
    (whatever base URL the hub is behind)."""
    nxt = answer.get("next")
    return parse_qsl(urlsplit(nxt).query, keep_blank_values=True) if nxt else None


def _all_pages(client: Client, path: str, params: list[tuple[str, str]], key: str) -> dict:
    """Every page of a list endpoint (500 items a request), as one answer: each next page is
    the one the service names (a cursor after the last row: nothing skipped or read twice
    when jobs end or go meanwhile); the total is the first page's."""
    data = client.json("GET", path, params=[*params, ("limit", "500")])
    rows: list = list(data.get(key, []))
    total = data.get("total", len(rows))
    following = _next_params(data)
    while following is not None and data.get(key):
        data = client.json("GET", path, params=following)
        rows += data.get(key, [])
        following = _next_params(data)
    return {key: rows, "total": total}


def cmd_job_list(args: argparse.Namespace, client: Client) -> int:
    params = _list_params(args)
    if args.state:
        params.append(("state", args.state))
    for label in args.label or []:
        _pairs([label], "KEY", "-l/--label")
        params.append(("label", label))
    data = _all_pages(client, "/jobs", params, "jobs")
    if args.output == "json":
        print_json(data)
    else:
        jobs = sorted(data["jobs"], key=lambda j: j.get("submitted") or "", reverse=True)
        owners = bool(args.all or args.user) or len({j.get("owner") for j in jobs}) > 1
        job_table(jobs, owners=owners)
    return EXIT_OK


def cmd_job_get(args: argparse.Namespace, client: Client) -> int:
    job = client.json("GET", f"/jobs/{_job_id(args.id)}")
    print_json(job) if args.output == "json" else job_details(job, client.url)
    return EXIT_OK


def cmd_job_events(args: argparse.Namespace, client: Client) -> int:
    data = client.json("GET", f"/jobs/{_job_id(args.id)}/events")
    print_json(data) if args.output == "json" else events_table(data["events"])
    return EXIT_OK


def cmd_job_logs(args: argparse.Namespace, client: Client) -> int:
    job_id = _job_id(args.id)
    rank = getattr(args, "rank", None)
    if args.follow:
        end = _follow(client, job_id, rank)
        note(_end_line(end))
        return EXIT_OK if end["state"] == "DONE" else EXIT_FAILED
    sink = sys.stdout.buffer
    for chunk in client.stream(f"/jobs/{job_id}/logs", _log_params(False, rank)):
        sink.write(chunk)
    sink.flush()
    return EXIT_OK


def _action(client: Client, job_id: str, action: str) -> dict:
    return client.json("POST", f"/jobs/{_job_id(job_id)}/{action}", ok=(200, 201, 202))


def _wait_ended(client: Client, job_id: str) -> dict:
    while True:
        job = client.json("GET", f"/jobs/{job_id}")
        if job["state"] in ENDED:
            return job
        time.sleep(POLL)


def _state_line(job: dict, extra: str = "") -> None:
    out(f"job {job['id']}: {job['state']}{extra}")


def cmd_job_stop(args: argparse.Namespace, client: Client) -> int:
    job = _action(client, args.id, "interrupt")
    if args.wait and job["state"] not in ENDED:
        job = _wait_ended(client, job["id"])
    if args.output == "json":
        print_json(job)
    else:
        _state_line(job, "" if job["state"] in ENDED else " (interruption under way)")
    return EXIT_OK


def cmd_job_simple_action(action: str) -> Callable[[argparse.Namespace, Client], int]:
    def run(args: argparse.Namespace, client: Client) -> int:
        job = _action(client, args.id, action)
        if args.output == "json":
            print_json(job)
        elif action == "rerun":
            out(job["id"])
        elif action == "push" and job["state"] == "RUNNING":
            _state_line(job, " (push asked: gpulab job get shows how it went)")
        else:
            _state_line(job)
        return EXIT_OK

    return run


def cmd_job_delete(args: argparse.Namespace, client: Client) -> int:
    job_id = _job_id(args.id)
    client.request("DELETE", f"/jobs/{job_id}", ok=(204,))
    if args.output == "json":
        print_json({"id": job_id, "deleted": True})
    else:
        out(f"job {job_id} deleted")
    return EXIT_OK


def cmd_usage(args: argparse.Namespace, client: Client) -> int:
    params = [("user", args.user)] if args.user else []
    if args.month is not None:
        return _month_report(args, client, params)
    data = client.json("GET", "/usage", params=params)
    if args.output == "json":
        print_json(data)
    else:
        table(
            ["USER", "BILLED MINUTES", "JOBS", "NOTEBOOKS"],
            [
                [
                    data.get("user"),
                    data.get("billed_minutes"),
                    data.get("jobs_billed_minutes"),
                    data.get("notebooks_billed_minutes"),
                ]
            ],
        )
        for line in fair_share_lines(data.get("fair_share")):
            out(line)
    return EXIT_OK


def _percent(x) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, int | float) else "?"


def fair_share_lines(fs) -> list[str]:
    """The usage API's ``fair_share`` as a few lines of text (none when it is missing)."""
    if not isinstance(fs, dict):
        return []
    lines = [
        "",
        f"fair share (half-life {fs.get('half_life_hours')} h): {fs.get('gpu_hours')} recent "
        f"GPU-hours, {_percent(fs.get('used'))} of everyone's for a share of "
        f"{_percent(fs.get('share'))}: factor {fs.get('factor')}",
    ]
    group = fs.get("group")
    if isinstance(group, dict):
        lines.append(
            f"group {group.get('name')}: {group.get('gpu_hours')} recent GPU-hours, "
            f"{_percent(group.get('used'))} of everyone's for a share of "
            f"{_percent(group.get('share'))}: factor {group.get('factor')}"
        )
    queued = fs.get("queued") or []
    if queued:
        places = ", ".join(
            f"{q['id'] if 'id' in q else 'notebook ' + str(q.get('notebook') or '(default)')} "
            f"{q.get('place')}"
            for q in queued[:10]
        )
        more = len(queued) > 10 or fs.get("queued_mine", 0) > len(queued)
        lines.append(
            f"in line: {fs.get('queued_mine')} of yours among {fs.get('queued_total')} "
            f"waiting (place: {places}{', ...' if more else ''})"
        )
    return lines


def _month_report(args: argparse.Namespace, client: Client, params: list) -> int:
    if args.month != "now":
        params.append(("month", args.month))
    data = client.json("GET", "/usage/report", params=[*params, ("limit", "500")])
    users = list(data.get("users") or [])
    month = data.get("month")
    following = _next_params(data)  # the service's next page: its month, after the last user
    while following is not None and data.get("users"):
        data = client.json("GET", "/usage/report", params=following)
        users += data.get("users") or []
        following = _next_params(data)
    data = {"month": month, "users": users}
    if args.output == "json":
        print_json(data)
    else:
        table(
            ["MONTH", "USER", "JOB MINUTES", "GPU MINUTES"],
            [
                [
                    data.get("month"),
                    r.get("user"),
                    r.get("jobs_billed_minutes"),
                    r.get("jobs_billed_gpu_minutes"),
                ]
                for r in data.get("users") or []
            ],
        )
    return EXIT_OK
