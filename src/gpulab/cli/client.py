"""The ``gpulab`` command line's connection: where the hub is, the token, and the HTTP client
(see :mod:`gpulab.cli`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
SERVICE_PATH = "/services/gpulab"
HUB_API = "/hub/api"
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

    def request(
        self, method: str, path: str, *, ok=(200,), hub: bool = False, **kw
    ) -> requests.Response:
        """``path`` of gpulab's API, or with ``hub`` of JupyterHub's (``/hub/api``: starting
        and stopping notebooks, which the hub does); one token reaches both."""
        try:
            kw.setdefault("timeout", TIMEOUT)
            base = self.url + HUB_API if hub else self.base
            r = self.session.request(method, base + path, allow_redirects=False, **kw)
        except requests.ConnectionError as e:
            raise CliError(f"cannot reach gpulab at {self.url}: {_reason(e)}") from None
        except requests.Timeout:
            raise CliError(f"gpulab at {self.url} did not answer in time") from None
        except requests.RequestException as e:
            raise CliError(f"request to gpulab at {self.url} failed: {e}") from None
        if r.status_code not in ok:
            raise CliError(self.describe_hub_error(r) if hub else self.describe_error(r))
        return r

    def describe_hub_error(self, r: requests.Response) -> str:
        """JupyterHub's answer ({status, message}) to a request of its API, as a sentence."""
        if r.status_code in (301, 302, 303, 307, 308, 401):
            return self.describe_error(r)
        try:
            body = r.json()
        except ValueError:
            body = None
        message = str(body.get("message") or "") if isinstance(body, dict) else ""
        if r.status_code == 403:
            return (
                f"the hub refused: {message or 'forbidden'} (a notebook's own token cannot "
                "start or stop servers: use a token from the hub's Token page)"
            )
        if message and message not in ("Not Found", "Bad Request"):
            return message
        if r.status_code == 404:
            return f"the hub at {self.url} has no such user or server (HTTP 404)"
        return f"the hub answered HTTP {r.status_code} {r.reason}".rstrip()

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

    def whoami(self) -> str:
        """The name of the token's user (the hub's ``GET /hub/api/user``)."""
        model = self.request("GET", "/user", hub=True).json()
        if not isinstance(model, dict) or not isinstance(model.get("name"), str):
            raise CliError("the hub did not say whose the token is (GET /hub/api/user)")
        return model["name"]

    def hub_events(self, path: str) -> Iterator[dict]:
        """The events of a JupyterHub event stream (``data: {...}`` lines), such as a spawn's
        progress, until the hub ends it; what is not an event (keep-alives) is skipped."""
        r = self.request("GET", path, hub=True, stream=True, timeout=TIMEOUT)
        with r:
            try:
                for line in r.iter_lines(decode_unicode=False):
                    if not line.startswith(b"data:"):
                        continue
                    try:
                        event = json.loads(line[5:])
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        yield event
            except requests.RequestException as e:
                raise CliError(f"the hub's event stream {path} broke off: {e}") from None

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
