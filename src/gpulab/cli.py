"""``gpulab``: the command line of gpulab's users, talking to the gpulab service's REST API.

    gpulab login --url URL [--token TOKEN]        save the hub URL and an API token (mode 0600)
    gpulab job run [options] -- CMD [ARGS...]     submit a training job; --follow streams its logs
    gpulab job list [--state A,B] [-l k=v]... [--all | --user NAME]
    gpulab job get|logs [-f]|events|stop [--wait]|resume|rerun|push|delete ID
    gpulab usage [--user NAME]
    gpulab notebook list [--all | --user NAME]

Every command prints a human table by default and the API's JSON with ``-o json``.

Where the hub is and who you are: ``GPULAB_URL`` (or ``JUPYTERHUB_URL``) and ``GPULAB_TOKEN``
(or ``JUPYTERHUB_API_TOKEN``, which notebooks already have), else the config file
``$GPULAB_CONFIG`` or ``~/.config/gpulab/config.json`` (``{"url": ..., "token": ...}``) that
``gpulab login`` writes. The token is never printed.

Exit codes: 0 success (for ``job run --follow`` and ``job logs -f``: the job ended DONE),
1 an API error (its message, and the field at fault, on stderr) or a followed job that ended
otherwise, 2 bad usage or missing configuration, 130 interrupted (Ctrl-C stops following, not
the job).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
SERVICE_PATH = "/services/gpulab"
#: job states that end a job, and those before its container exists
ENDED = frozenset({"DONE", "INTERRUPTED", "FAILED", "ERROR", "SYNC_FAILED"})
NOT_STARTED = frozenset({"QUEUED", "INITIALIZING", "PENDING"})
POLL = 0.5
TIMEOUT = (10, 120)  # connect, read


class CliError(Exception):
    """A failure reported as ``gpulab: error: MESSAGE`` with ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


# --- configuration -------------------------------------------------------------------------------


def config_path() -> Path:
    if os.environ.get("GPULAB_CONFIG"):
        return Path(os.environ["GPULAB_CONFIG"]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "gpulab" / "config.json"


def read_config() -> dict:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read the config file {path}: {e}", EXIT_USAGE) from None
    if not isinstance(data, dict):
        raise CliError(f"the config file {path} must hold a JSON object", EXIT_USAGE)
    return data


def write_config(url: str, token: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "token": token}, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)  # whatever the umask
    os.replace(tmp, path)
    return path


def normalize_url(url: str) -> str:
    """The hub's public URL, whether given as the hub, its API or the gpulab service."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"the hub URL must start with http:// or https://, not {url!r}", EXIT_USAGE)
    path = parts.path
    for suffix in (SERVICE_PATH + "/api", SERVICE_PATH, "/hub/api", "/hub"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def settings(args: argparse.Namespace) -> tuple[str, str]:
    """(hub URL, token) from --url, the environment, then the config file."""
    cfg: dict | None = None

    def from_config(key: str) -> str:
        nonlocal cfg
        if cfg is None:
            cfg = read_config()
        value = cfg.get(key) or ""
        return value if isinstance(value, str) else ""

    url = (
        getattr(args, "url", None)
        or os.environ.get("GPULAB_URL")
        or os.environ.get("JUPYTERHUB_URL")
        or from_config("url")
    )
    if not url:
        raise CliError(
            "no hub URL: set GPULAB_URL=https://your-hub, or run "
            "`gpulab login --url https://your-hub --token TOKEN`",
            EXIT_USAGE,
        )
    token = (
        os.environ.get("GPULAB_TOKEN")
        or os.environ.get("JUPYTERHUB_API_TOKEN")
        or from_config("token")
    )
    if not token:
        raise CliError(
            "no API token: create one on the hub's Token page (/hub/token), then set "
            "GPULAB_TOKEN=... or run `gpulab login --url URL --token TOKEN`",
            EXIT_USAGE,
        )
    return normalize_url(url), token


# --- HTTP ---------------------------------------------------------------------------------------


class Client:
    def __init__(self, url: str, token: str):
        self.url = url
        self.base = url + SERVICE_PATH + "/api"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"
        self.session.headers["User-Agent"] = "gpulab-cli"

    def request(self, method: str, path: str, *, ok=(200,), **kw) -> requests.Response:
        try:
            kw.setdefault("timeout", TIMEOUT)
            r = self.session.request(method, self.base + path, allow_redirects=False, **kw)
        except requests.ConnectionError as e:
            raise CliError(f"cannot reach gpulab at {self.url}: {_reason(e)}") from None
        except requests.Timeout:
            raise CliError(f"gpulab at {self.url} did not answer in time") from None
        except requests.RequestException as e:
            raise CliError(f"request to gpulab at {self.url} failed: {e}") from None
        if r.status_code not in ok:
            raise CliError(self.describe_error(r))
        return r

    def describe_error(self, r: requests.Response) -> str:
        if r.status_code in (301, 302, 303, 307, 308, 401):
            # the service sends unauthenticated requests to the hub's log-in
            return (
                f"the hub at {self.url} refused the API token (expired or revoked?): create "
                "one on the hub's Token page and set GPULAB_TOKEN or run `gpulab login`"
            )
        try:
            body = r.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("message"):
            message = str(body["message"])
            if r.status_code == 403 and message == "Forbidden":
                message = "forbidden: the hub refused the API token, or it lacks gpulab's scopes"
            if body.get("field"):
                message += f" (field: {body['field']})"
            return message
        if r.status_code == 404:
            return (
                f"no gpulab service at {self.url}{SERVICE_PATH} (HTTP 404): is GPULAB_URL "
                "the hub's address?"
            )
        return f"gpulab answered HTTP {r.status_code} {r.reason}".rstrip()

    def json(self, method: str, path: str, *, ok=(200,), **kw) -> Any:
        r = self.request(method, path, ok=ok, **kw)
        if r.status_code == 204 or not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise CliError(f"gpulab answered HTTP {r.status_code} with no JSON") from None

    def stream(self, path: str, params: dict) -> Iterable[bytes]:
        r = self.request("GET", path, params=params, stream=True, timeout=(TIMEOUT[0], None))
        with r:
            try:
                yield from r.iter_content(chunk_size=None)
            except requests.RequestException:  # the connection dropped: the caller re-reads
                return


def _reason(e: Exception) -> str:
    """The innermost cause of a connection error, e.g. 'Connection refused'."""
    text = str(e)
    for marker in ("Errno", "Failed to resolve", "Name or service not known"):
        i = text.find(marker)
        if i >= 0:
            return text[i - 1 if text[i - 1 : i] == "[" else i :].rstrip("')\"")
    return text


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


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else "-"


def _exit(job: dict) -> str:
    return "-" if job.get("exit_code") is None else str(job["exit_code"])


def _gpus(job: dict) -> str:
    gpus = ((job.get("spec") or {}).get("resources") or {}).get("gpus")
    return "-" if gpus is None else str(gpus)


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


def job_details(job: dict) -> None:
    spec = job.get("spec") or {}
    res = spec.get("resources") or {}
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
            + (f" (flavor {spec['flavor']})" if spec.get("flavor") else ""),
        ),
        ("Devices", ",".join(job.get("devices") or []) or "-"),
        ("Volumes", ", ".join(spec.get("volumes") or []) or "-"),
        ("Env", ", ".join(f"{k}={v}" for k, v in (spec.get("env") or {}).items()) or "-"),
        ("Labels", ", ".join(f"{k}={v}" for k, v in (spec.get("labels") or {}).items()) or "-"),
        ("Timeout", duration(float(spec["timeout"])) if spec.get("timeout") else "-"),
        ("Retries", f"{job.get('restarts', 0)} of {spec.get('retries', 0)} used"),
        (
            "Hang restart",
            f"after {duration(float(hang.get('period') or 0))} without progress "
            f"({job.get('hang_restarts', 0)} so far)"
            if hang.get("enabled")
            else "off",
        ),
        ("Preemptible", "yes" if spec.get("preemptible") else "no"),
        ("Priority", spec.get("priority")),
        ("Submitted", when(job.get("submitted"))),
        ("Running since", when(job.get("running_since"))),
        ("Runtime", runtime(job)),
        ("Billed minutes", job.get("billed_minutes")),
    ]
    width = max(len(k) for k, _ in fields) + 1
    for key, value in fields:
        out(f"{key + ':':<{width}} {'-' if value in (None, '') else value}")
    if job.get("history"):
        out()
        events_table(job["history"])


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
    for key in ("name", "framework", "version", "image", "flavor"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    resources = {
        k: v
        for k, v in (("gpus", args.gpu), ("cpus", args.cpu), ("memory", args.memory))
        if v is not None
    }
    if resources:
        body["resources"] = resources
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
    if args.priority is not None:
        body["priority"] = args.priority
    return body


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


def follow_logs(client: Client, job_id: str) -> dict:
    """Write the job's output to stdout as it comes, until the job ends; returns the job.

    The service streams a container's log while it runs; before that (QUEUED...) there is
    nothing to stream, so this waits. A retried job runs again in the same container, whose
    log then starts with what was already shown: that much is skipped. A job put back in the
    queue (preempted) gets a new container, whose log is shown from its start.
    """
    shown = 0
    sink = sys.stdout.buffer
    while True:
        job = client.json("GET", f"/jobs/{job_id}")
        state = job["state"]
        if state in NOT_STARTED:
            if state == "QUEUED":
                shown = 0
            time.sleep(POLL)
            continue
        ended = state in ENDED
        received = 0
        for chunk in client.stream(
            f"/jobs/{job_id}/logs", {"follow": "false" if ended else "true"}
        ):
            start = max(shown - received, 0)
            received += len(chunk)
            if start < len(chunk):
                sink.write(chunk[start:])
                sink.flush()
        shown = max(shown, received)
        if ended:
            return job
        time.sleep(POLL)


def _follow(client: Client, job_id: str) -> dict:
    try:
        return follow_logs(client, job_id)
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


def _all_pages(client: Client, path: str, params: list[tuple[str, str]], key: str) -> dict:
    """Every page of a list endpoint (500 items a request), as one answer."""
    rows: list = []
    offset = 0
    while True:
        data = client.json("GET", path, params=[*params, ("limit", "500"), ("offset", str(offset))])
        rows += data.get(key, [])
        if not data.get("next") or not data.get(key):
            return {key: rows, "total": data.get("total", len(rows))}
        offset = len(rows)


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
    print_json(job) if args.output == "json" else job_details(job)
    return EXIT_OK


def cmd_job_events(args: argparse.Namespace, client: Client) -> int:
    data = client.json("GET", f"/jobs/{_job_id(args.id)}/events")
    print_json(data) if args.output == "json" else events_table(data["events"])
    return EXIT_OK


def cmd_job_logs(args: argparse.Namespace, client: Client) -> int:
    job_id = _job_id(args.id)
    if args.follow:
        end = _follow(client, job_id)
        note(_end_line(end))
        return EXIT_OK if end["state"] == "DONE" else EXIT_FAILED
    sink = sys.stdout.buffer
    for chunk in client.stream(f"/jobs/{job_id}/logs", {"follow": "false"}):
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
    return EXIT_OK


def cmd_notebook_list(args: argparse.Namespace, client: Client) -> int:
    data = _all_pages(client, "/notebooks", _list_params(args), "notebooks")
    if args.output == "json":
        print_json(data)
        return EXIT_OK
    rows = []
    for nb in data["notebooks"]:
        opts = nb.get("options") or {}
        image = opts.get("image") or ""
        if opts.get("framework"):
            image = f"{opts['framework']} {opts.get('version') or ''}".strip()
        rows.append(
            [
                nb.get("user"),
                nb.get("server") or "(default)",
                nb.get("state"),
                image or "-",
                opts.get("gpus", "-"),
                when(nb.get("created")),
                when(nb.get("running_since")),
            ]
        )
    table(["USER", "SERVER", "STATE", "IMAGE", "GPUS", "CREATED", "RUNNING SINCE"], rows)
    return EXIT_OK


# --- the parser ---------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit 2 with the usage, as argparse does, but one prefix
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"gpulab: error: {message}\n")


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (-o json, --url)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default=argparse.SUPPRESS,
        help="table (default) or json (the API's own JSON)",
    )
    p.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="the hub's URL (default: $GPULAB_URL, $JUPYTERHUB_URL or the config file)",
    )
    return p


def _int_range(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    p = Parser(
        prog="gpulab",
        description="Training jobs and notebooks on a gpulab hub.",
        epilog="Configuration: GPULAB_URL and GPULAB_TOKEN, or `gpulab login`. "
        "Exit codes: 0 ok, 1 API error or job not DONE, 2 usage/configuration, 130 Ctrl-C.",
        parents=[common],
    )
    top = p.add_subparsers(dest="group", metavar="COMMAND", parser_class=Parser)
    top.required = True

    login = top.add_parser(
        "login",
        parents=[common],
        help="save the hub URL and your API token (~/.config/gpulab/config.json, mode 0600)",
        description="Check the token against the hub, then save the URL and token to "
        "$GPULAB_CONFIG or ~/.config/gpulab/config.json (mode 0600). Without --token (or with "
        "--token -) the token is read from the terminal or stdin, keeping it out of the "
        "shell history.",
    )
    login.add_argument("--token", help="an API token from the hub's Token page; - for stdin")
    login.add_argument("--no-verify", action="store_true", help="save without checking")
    login.set_defaults(func=cmd_login, needs_client=False)

    job = top.add_parser("job", help="training jobs", parents=[common]).add_subparsers(
        dest="command_name", metavar="ACTION", parser_class=Parser
    )
    job.required = True

    run = job.add_parser(
        "run",
        parents=[common],
        help="submit a job",
        usage="gpulab job run [options] -- CMD [ARGS...]",
        description="Submit a job that runs CMD with ARGS (put -- before CMD). Prints the "
        "job's id; with --follow, streams its output until it ends and exits 0 if it ended "
        "DONE, 1 otherwise.",
    )
    run.add_argument("--name", help="lowercase letters, digits and '-' (default: generated)")
    image = run.add_mutually_exclusive_group()
    image.add_argument("--framework", help="a framework of the catalog (default: its default)")
    image.add_argument("--image", help="an image of the catalog or one the admins allow")
    run.add_argument("--version", help="the framework's version (default: its first)")
    run.add_argument("--flavor", help="a resource flavor; --gpu/--cpu/--memory override it")
    run.add_argument(
        "--gpu", "--gpus", type=_int_range(0), metavar="N", help="GPUs (default 1 without flavor)"
    )
    run.add_argument("--cpu", "--cpus", type=_positive_float, metavar="N", help="CPUs (default 1)")
    run.add_argument("--memory", metavar="SIZE", help="memory, such as 512M or 8G (default 4G)")
    run.add_argument(
        "-v",
        "--volume",
        action="append",
        metavar="VOLUME",
        help="bucket@store[/prefix]:/mount[:ro|rw|rwd]; repeatable",
    )
    run.add_argument("-e", "--env", action="append", metavar="NAME=VALUE", help="repeatable")
    run.add_argument("-l", "--label", action="append", metavar="KEY=VALUE", help="repeatable")
    run.add_argument("--timeout", metavar="DURATION", help="most the job may run: 90s, 2h, 1d...")
    run.add_argument("--retries", type=int, metavar="N", help="restarts after a failure (0-128)")
    run.add_argument(
        "--hang-restart",
        metavar="PERIOD",
        help="restart the command in place after PERIOD without output or CPU progress",
    )
    run.add_argument("--preemptible", action="store_true", help="may use idle GPUs beyond quota")
    run.add_argument("--priority", type=int, metavar="N", help="0-100 (default 50)")
    run.add_argument("-f", "--follow", action="store_true", help="stream the output until it ends")
    run.add_argument("command", nargs="*", metavar="CMD", help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_job_run)

    ls = job.add_parser("list", aliases=["ls"], parents=[common], help="list your jobs")
    ls.add_argument("--state", metavar="A,B", help="only these states, e.g. RUNNING,QUEUED")
    ls.add_argument("-l", "--label", action="append", metavar="KEY=VALUE", help="repeatable")
    who = ls.add_mutually_exclusive_group()
    who.add_argument("-A", "--all", action="store_true", help="every user's jobs (admins)")
    who.add_argument("--user", help="this user's jobs (admins)")
    ls.set_defaults(func=cmd_job_list)

    def with_id(name: str, help_: str, func, **kw) -> argparse.ArgumentParser:
        sub = job.add_parser(name, parents=[common], help=help_, **kw)
        sub.add_argument("id", metavar="ID", help="the job's id")
        sub.set_defaults(func=func)
        return sub

    with_id("get", "a job, its spec and history", cmd_job_get, aliases=["describe"])
    logs = with_id("logs", "a job's output", cmd_job_logs)
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="stream until the job ends; exit 0 if it ended DONE, 1 otherwise",
    )
    with_id("events", "a job's history", cmd_job_events)
    stop = with_id("stop", "interrupt a queued or running job", cmd_job_stop, aliases=["cancel"])
    stop.add_argument("--wait", action="store_true", help="wait until it is INTERRUPTED")
    with_id("resume", "queue an INTERRUPTED job again", cmd_job_simple_action("resume"))
    with_id("rerun", "submit a copy of a job (prints the new id)", cmd_job_simple_action("rerun"))
    with_id("push", "retry the push of a SYNC_FAILED job", cmd_job_simple_action("push"))
    with_id("delete", "delete an ended job, its logs and volumes", cmd_job_delete, aliases=["rm"])

    usage = top.add_parser("usage", parents=[common], help="your billed minutes")
    usage.add_argument("--user", help="this user's (admins)")
    usage.set_defaults(func=cmd_usage)

    nb = top.add_parser("notebook", aliases=["notebooks"], parents=[common], help="notebooks")
    nb_actions = nb.add_subparsers(dest="command_name", metavar="ACTION", parser_class=Parser)
    nb_actions.required = True
    nb_ls = nb_actions.add_parser("list", aliases=["ls"], parents=[common], help="your notebooks")
    who = nb_ls.add_mutually_exclusive_group()
    who.add_argument("-A", "--all", action="store_true", help="every user's notebooks (admins)")
    who.add_argument("--user", help="this user's notebooks (admins)")
    nb_ls.set_defaults(func=cmd_notebook_list)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2)
        return int(e.code or 0)
    if not hasattr(args, "output"):  # -o is SUPPRESSed so that `gpulab -o json job list` works
        args.output = "table"
    try:
        if not getattr(args, "needs_client", True):
            return args.func(args)
        url, token = settings(args)
        return args.func(args, Client(url, token))
    except CliError as e:
        note(f"gpulab: error: {e}")
        return e.code
    except KeyboardInterrupt:
        note("gpulab: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. | head
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (no flush error at exit)
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
