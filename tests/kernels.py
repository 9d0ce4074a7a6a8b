"""Run code in a notebook's kernel through the hub, as JupyterLab does: create a kernel with
the notebook server's REST API and send an execute_request on its websocket (through the
hub's proxy, with the user's token), collecting what the kernel prints."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

import requests

from .conftest import run_async


async def _execute(url: str, token: str, code: str, timeout: float) -> tuple[str, str]:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(
        HTTPRequest(url, headers={"Authorization": f"token {token}"}, connect_timeout=30)
    )
    msg_id = uuid.uuid4().hex
    conn.write_message(
        json.dumps(
            {
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
        )
    )
    out, err = [], []
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
            elif kind == "status" and content.get("execution_state") == "idle":
                return "".join(out), "".join(err)
    finally:
        conn.close()
    raise TimeoutError(f"the kernel did not finish in {timeout} s; printed {''.join(out)!r}")


def run_code(hub, user: str, server: str, token: str, code: str, timeout: float = 120) -> str:
    """What ``code`` prints on stdout in a new kernel of the user's running notebook; an
    AssertionError with the kernel's error if it raised."""
    base = f"{hub.url}/user/{user}/{server}"
    r = requests.post(
        f"{base}/api/kernels",
        headers={"Authorization": f"token {token}"},
        json={"name": "python3"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    ws = f"ws://127.0.0.1:{hub.port}/user/{user}/{server}/api/kernels/{r.json()['id']}/channels"
    out, err = run_async(_execute(ws, token, code, timeout))
    assert "Error" not in err, err
    return out
