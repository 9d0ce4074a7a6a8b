"""Run code in a notebook's kernel through the hub, as JupyterLab does: create a kernel with
the notebook server's REST API and send an execute_request on its websocket (through the
hub's proxy, with the user's token)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

import requests

from ..conftest import run_async


def _execute_request(code: str) -> tuple[str, str]:
    """(msg_id, the execute_request message) for ``code``."""
    msg_id = uuid.uuid4().hex
    message = {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "test",
            "session": uuid.uuid4().hex,
            "version": "5.3",
            "date": datetime.now(UTC).isoformat(),
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "channel": "shell",
        "buffers": [],
    }
    return msg_id, json.dumps(message)


async def _execute(url: str, token: str, code: str, until: str, timeout: float):
    """Send ``code``; read the kernel's messages about it until its status is ``until``
    ('busy': it runs, hang up and let it run on; 'idle': it finished). Returns what it
    printed on stdout and stderr (and its error)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(
        HTTPRequest(url, headers={"Authorization": f"token {token}"}, connect_timeout=30)
    )
    msg_id, message = _execute_request(code)
    conn.write_message(message)
    out: list[str] = []
    err: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            raw = await conn.read_message()
            assert raw is not None, "the kernel's websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg.get("msg_type"), msg.get("content", {})
            if kind == "stream":
                (out if content.get("name") == "stdout" else err).append(content["text"])
            elif kind == "error":
                err.append(f"{content.get('ename')}: {content.get('evalue')}")
            elif kind == "status" and content.get("execution_state") == until:
                return "".join(out), "".join(err)
    finally:
        conn.close()
    raise TimeoutError(f"the kernel was not {until} in {timeout} s; printed {''.join(out)!r}")


def _new_kernel(hub, user: str, server: str, token: str) -> str:
    """A new python3 kernel of the user's running notebook; its channels' websocket URL."""
    r = requests.post(
        f"{hub.url}/user/{user}/{server}/api/kernels",
        headers={"Authorization": f"token {token}"},
        json={"name": "python3"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return f"ws://127.0.0.1:{hub.port}/user/{user}/{server}/api/kernels/{r.json()['id']}/channels"


def run_code(hub, user: str, server: str, token: str, code: str, timeout: float = 120) -> str:
    """What ``code`` prints on stdout in a new kernel of the user's running notebook; an
    AssertionError with the kernel's error if it raised."""
    url = _new_kernel(hub, user, server, token)
    out, err = run_async(_execute(url, token, code, "idle", timeout))
    assert "Error" not in err, err
    return out


def start_code(hub, user: str, server: str, token: str, code: str) -> str:
    """Start ``code`` in a new kernel and hang up once the kernel says busy (it runs on,
    nothing more goes through the proxy). Returns the kernel's channels URL."""
    url = _new_kernel(hub, user, server, token)
    run_async(_execute(url, token, code, "busy", 60))
    return url
