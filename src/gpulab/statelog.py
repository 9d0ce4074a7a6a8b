"""One log line per state change of a job or a notebook, written by the compare-and-set that
made it (``JobRecords.transition``, ``NotebookRecords`` and their creations), once committed.

    job j3f2a1b2c3d4e owner=alice QUEUED->INITIALIZING reason=SCHEDULED message="placed on ..."
    notebook alice/train1 owner=alice -->STARTING reason=SPAWN message="python 3.11 ..."

(``-`` is the state before a record existed; a default server is ``USER/_default``.)

Logger ``gpulab.state``, level INFO. The same facts ride on the record as fields (``extra``:
``workload``, ``workload_id``, ``owner``, ``old_state``, ``state``, ``reason``, ``detail``,
``exit_code``), so that a JSON formatter (the service's ``log_format = "json"``) emits them as
fields of their own.

Messages are text from users and engines: before they are logged they are put on one line,
stripped of anything shaped like a credential (``NAME=value`` assignments as in an environment,
``token ...``/``password: ...`` pairs, AWS access key ids, and every value registered with
:func:`register_sensitive`, such as the service's API token and the stores' keys) and cut to
:data:`MESSAGE_CAP` characters. The environment of a workload is never logged.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Iterable

log = logging.getLogger("gpulab.state")

#: longest message logged (characters, after redaction); the rest is counted, not shown
MESSAGE_CAP = 300
REDACTED = "[redacted]"
#: registered values shorter than this are not searched for (too likely to be ordinary text)
_MIN_SENSITIVE = 8

_ASSIGNMENT = re.compile(r"""\b([A-Z_][A-Z0-9_]*)=("[^"]*"|'[^']*'|\S+)""")
_AUTHORIZATION = re.compile(
    r"(?i)\b(authorization\s*[:=]\s*)(?:(?:token|bearer|basic)\s+)?[^\s,;]+"
)
_BEARER = re.compile(r"(?i)\b(token|bearer)(\s+)[A-Za-z0-9._~+/=-]{16,}")
_PAIR = re.compile(
    r"(?i)(?<![\w-])([\w-]*(?:token|password|passwd|secret|credential|api[_-]?key|"
    r"access[_-]?key)[\w-]*)(\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;]+)"
)
_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[0-9A-Z]{12,}\b")
_SAFE_TOKEN = re.compile(r"^[\w.@+:/-]+$")

_sensitive: set[str] = set()
_sensitive_lock = threading.Lock()


def register_sensitive(values: Iterable[str | None]) -> None:
    """Values never to be logged by :func:`state_change` (an API token, a store's keys)."""
    with _sensitive_lock:
        _sensitive.update(v for v in values if v and len(v) >= _MIN_SENSITIVE)


def redact(text: str) -> str:
    """``text`` without registered values and without anything shaped like a credential."""
    with _sensitive_lock:
        known = sorted(_sensitive, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _ACCESS_KEY_ID.sub(REDACTED, text)
    text = _AUTHORIZATION.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    return _PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def clean_message(message: str, cap: int = MESSAGE_CAP) -> str:
    """``message`` on one line, redacted, at most ``cap`` characters plus a count of the rest."""
    text = redact(" ".join(str(message).split()))
    if len(text) > cap:
        text = f"{text[:cap]}... (+{len(text) - cap} chars)"
    return text


def _value(text: str) -> str:
    """A field value as written in the line: bare if plain, else JSON-quoted."""
    return text if text and _SAFE_TOKEN.match(text) else json.dumps(text)


def format_change(
    workload: str,
    workload_id: str,
    owner: str,
    old: str | None,
    new: str,
    reason: str = "",
    message: str = "",
    exit_code: int | None = None,
) -> tuple[str, dict]:
    """The line and the ``extra`` fields of one state change (pure: no I/O)."""
    detail = clean_message(message) if message else ""
    fields = {
        "workload": workload,
        "workload_id": workload_id,
        "owner": owner,
        "old_state": old or "",
        "state": new,
        "reason": reason,
        "detail": detail,
        "exit_code": exit_code,
    }
    line = f"{workload} {_value(workload_id)} owner={_value(owner)} {old or '-'}->{new}"
    if reason:
        line += f" reason={_value(reason)}"
    if exit_code is not None:
        line += f" exit_code={exit_code}"
    if detail:
        line += f" message={json.dumps(detail, ensure_ascii=False)}"
    return line, fields


def state_change(
    workload: str,
    workload_id: str,
    owner: str,
    old: str | None,
    new: str,
    reason: str = "",
    message: str = "",
    exit_code: int | None = None,
) -> None:
    """Log one committed state change (see the module's documentation)."""
    if not log.isEnabledFor(logging.INFO):
        return
    try:
        line, fields = format_change(
            workload, workload_id, owner, old, new, reason, message, exit_code
        )
    except Exception:  # noqa: BLE001 - a log line never fails a state change
        log.exception("%s %s: state change to %s not logged", workload, workload_id, new)
        return
    log.info("%s", line, extra=fields)


def follow_hub_log() -> None:
    """In the hub's process, send gpulab's loggers (``gpulab.*``) to the hub's own log, as
    JupyterHub does with tornado's: the hub configures no root handler, so their INFO lines
    (notebook state changes) would be dropped. Elsewhere (the service), does nothing."""
    app = sys.modules.get("jupyterhub.app")  # loaded in the hub's process only
    if app is not None and app.JupyterHub.initialized():
        logging.getLogger("gpulab").parent = app.JupyterHub.instance().log


def json_formatter() -> logging.Formatter:
    """One JSON object per line, with the ``extra`` fields of :func:`state_change` as fields."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
    )
