"""VS Code as the notebook's editor, in a real headless Chromium against a real hub whose
workspaces live in a real S3-speaking server: chosen in the spawn form, the workbench loads at
the notebook's URL (code-server behind jupyter-server-proxy, websockets through the hub's proxy
and the notebook server), a file created and saved in its editor is pushed at the stop and is
there again after the next start, in a container whose local volume was removed, and the
integrated terminal runs a command. Another user, and a websocket from another site's
origin, get a 403."""

from __future__ import annotations

import pytest
import requests

from ..support.containers import sh
from ..support.s3 import MotoS3Server, credentials_file, workspace_store_config
from .conftest import WORKBENCH, login, run_command, spawn_vscode_from_form, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

TEXT = "written in VS Code"


@pytest.fixture(scope="module")
def s3():
    server = MotoS3Server().start()
    server.client = server.boto_client()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hub(hub_with, tmp_path_factory, s3):
    credentials = credentials_file(tmp_path_factory.mktemp("vscode"))
    return hub_with(workspace_store_config(s3, credentials, "workspaces-vscode"))


def test_vscode_from_the_form_file_survives_restart_and_terminal(
    hub, s3, new_page, shots, docker_client
):
    page = new_page()
    login(page, hub, "vera")
    spawn_vscode_from_form(page, hub, "vera", "code")
    shots(page, "vscode-workbench")
    nb = hub.notebook("vera", "code").json()
    assert nb["state"] == "RUNNING" and nb["options"]["editor"] == "vscode"

    # a new file from the explorer's "New File..." (named in the tree), typed into and saved
    header = page.locator(".pane", has=page.locator(".explorer-folders-view")).locator(
        ".pane-header"
    )
    header.hover()
    header.locator('.action-label[aria-label^="New File"]').click()
    name_box = page.locator(".explorer-folders-view .monaco-inputbox input")
    name_box.wait_for()
    name_box.fill("from-vscode.txt")
    name_box.press("Enter")
    page.wait_for_selector('.tab.active[aria-label*="from-vscode.txt"]', timeout=30_000)
    page.locator(".monaco-editor .view-lines").first.click()
    page.keyboard.type(TEXT)
    page.keyboard.press("Control+S")

    def saved():
        code, out = sh(docker_client, nb["container"], "cat /workspace/from-vscode.txt")
        return out.strip() if code == 0 else None

    assert wait_until(lambda: saved() == TEXT, timeout=30, what="the saved file")
    shots(page, "vscode-saved-file")

    # the integrated terminal runs a command (its output lands in the workspace)
    run_command(page, "Terminal: Create New Terminal")
    page.wait_for_selector(".terminal-wrapper .xterm", timeout=30_000)
    # keys go to the terminal once it has the focus (a shell not yet ready buffers them)
    page.wait_for_function(
        "() => document.activeElement && "
        "document.activeElement.classList.contains('xterm-helper-textarea')",
        timeout=30_000,
    )
    page.keyboard.type("echo $((6 * 7)) $(whoami) $(pwd) | tee /workspace/term.txt")
    page.keyboard.press("Enter")

    def term_out():
        code, out = sh(docker_client, nb["container"], "cat /workspace/term.txt 2>/dev/null")
        return out.strip() if code == 0 and out.strip() else None

    assert wait_until(term_out, timeout=30) == "42 jovyan /workspace"
    shots(page, "vscode-terminal")

    # another user is refused at the notebook's VS Code (the hub's authentication)
    other = new_page()
    login(other, hub, "otto")
    resp = other.goto(f"{hub.url}/user/vera/code/vscode/")
    assert resp.status == 403, resp.status
    assert other.locator(WORKBENCH).count() == 0

    # a websocket from another site's page is refused, even with the owner's cookies; the
    # same handshake from the hub's own origin is accepted (VS Code's own connection URL)
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}

    def handshake(origin: str) -> requests.Response:
        return requests.get(
            f"{hub.url}/user/vera/code/vscode/",
            params={
                "reconnectionToken": "t1",
                "reconnection": "false",
                "skipWebSocketFrames": "false",
            },
            headers={
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Origin": origin,
            },
            cookies=cookies,
            timeout=30,
            allow_redirects=False,
            stream=True,
        )

    r = handshake("https://attacker.example")
    assert r.status_code == 403, (r.status_code, r.text[:300])
    r = handshake(hub.url)
    assert r.status_code == 101, (r.status_code, r.headers)
    r.close()

    # stop: the workspace is pushed; the local volume goes (a new host); start again
    hub.stop_server("vera", "code")
    nb = hub.notebook("vera", "code").json()
    assert nb["state"] == "STOPPED", nb["history"][-1]
    body = s3.client.get_object(
        Bucket="workspaces-vscode", Key="workspaces/vera/code/from-vscode.txt"
    )["Body"].read()
    assert body.decode().strip() == TEXT
    docker_client.volumes.get(nb["container"] + "-workspace").remove(force=True)

    page = new_page()
    login(page, hub, "vera")
    spawn_vscode_from_form(page, hub, "vera", "code")
    row = page.locator('.explorer-folders-view .monaco-list-row[aria-label*="from-vscode.txt"]')
    row.wait_for(timeout=30_000)
    row.click()
    page.wait_for_selector(f'.monaco-editor .view-lines:has-text("{TEXT}")', timeout=30_000)
    shots(page, "vscode-after-restart")
    nb = hub.notebook("vera", "code").json()
    code, out = sh(docker_client, nb["container"], "cat /workspace/from-vscode.txt")
    assert code == 0 and out.strip() == TEXT, out
    hub.stop_server("vera", "code")
