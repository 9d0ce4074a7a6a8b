"""A job's TensorBoard, opened by its owner in headless Chromium through the hub's URL."""

from __future__ import annotations

import re
import time

import requests

from ..support.programs import RECORDER
from .conftest import login, wait_until

SERVICE = "/services/gpulab"
#: write a few scalars with torch's SummaryWriter, then serve them on the job's port
TENSORBOARD = r"""
set -e
python - <<'EOF'
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter("/tmp/tb/run1")
for step in range(20):
    w.add_scalar("train/loss", 1.0 / (step + 1), step)
w.close()
EOF
exec tensorboard --logdir /tmp/tb --host 0.0.0.0 --port 6006 \
    --path_prefix "$GPULAB_PORT_TENSORBOARD_PATH" --load_fast false
"""


def test_the_owner_opens_tensorboard_and_sees_its_scalars(hub, new_page, shots):
    token = hub.create_user("tess")
    api = f"{hub.url}{SERVICE}/api"
    headers = {"Authorization": f"token {token}"}
    r = requests.post(
        f"{api}/jobs",
        headers=headers,
        timeout=30,
        json={
            "name": "tb",
            "framework": "pytorch",
            "command": TENSORBOARD,
            "resources": {"gpus": 0, "cpus": 1, "memory": "2G"},
            "ports": [{"port": 6006, "name": "tensorboard"}],
        },
    )
    assert r.status_code == 201, r.text
    job = r.json()
    url = hub.url + job["ports"][0]["url"]

    def serving():
        state = requests.get(f"{api}/jobs/{job['id']}", headers=headers, timeout=30).json()
        assert state["state"] in ("QUEUED", "INITIALIZING", "PENDING", "RUNNING"), state
        return requests.get(url, headers=headers, timeout=30).status_code == 200

    wait_until(serving, timeout=120, what="TensorBoard answering on its port")

    page = new_page()
    login(page, hub, "tess")
    started = time.monotonic()
    page.goto(url)
    # the scalars dashboard lists the run and draws the tag's card
    page.wait_for_selector("text=train/loss", timeout=60_000)
    page.wait_for_selector("text=run1", timeout=30_000)
    page.wait_for_selector("text=0.05", timeout=30_000)  # the last step's value, in its table
    print(f"TensorBoard showed its scalars {time.monotonic() - started:.1f} s after opening")
    assert re.search(r"/jobs/[a-z0-9]+/ports/tensorboard/", page.url)
    shots(page, "tensorboard")

    # another user is refused (the same 404 as for a job that does not exist)
    other = new_page()
    login(other, hub, "mallory")
    answer = other.goto(url)
    assert answer is not None and answer.status == 404
    assert "no job" in other.inner_text("body")
    requests.post(f"{api}/jobs/{job['id']}/interrupt", headers=headers, timeout=30)


def test_secrets_page_and_the_submit_forms_extra_fields(hub, new_page, shots):
    page = new_page()
    login(page, hub, "sara")
    page.goto(f"{hub.url}{SERVICE}/secrets")
    page.fill("#s-name", "wandb")
    page.fill("#s-value", "page-secret-value-123")
    page.click("#save-secret")
    page.wait_for_selector("#saved")
    assert "wandb" in page.inner_text("#secrets")
    assert "page-secret-value-123" not in page.content()
    shots(page, "secrets")

    page.goto(f"{hub.url}{SERVICE}/jobs/new")
    page.fill("#f-command", 'test -n "$WANDB_API_KEY" && pwd && sleep 30')
    page.fill("#f-gpus", "0")
    page.fill("#f-cpus", "0.5")
    page.fill("#f-memory", "512M")
    page.click("text=Secrets, ports, git repositories, working directory")
    page.fill("#f-secret-env", "WANDB_API_KEY=wandb")
    page.fill("#f-ports", "web=8080")
    page.fill("#f-working-dir", "/tmp")
    page.check("#f-read-only")
    shots(page, "submit-extras")
    page.click("#submit-job")
    page.wait_for_selector("#ports")
    assert "secret wandb" in (page.text_content("main") or "")
    assert "page-secret-value-123" not in page.content()
    link = page.get_attribute("#ports a[data-port=web]", "href")
    assert re.fullmatch(r"/services/gpulab/jobs/[a-z0-9]+/ports/web/", link or "")
    shots(page, "job-with-port")
    # a bad port line comes back next to its field
    page.goto(f"{hub.url}{SERVICE}/jobs/new")
    page.fill("#f-command", "true")
    page.click("text=Secrets, ports, git repositories, working directory")
    page.fill("#f-ports", "web=http")
    page.click("#submit-job")
    page.wait_for_selector("#error-ports")
    assert "must be a number" in page.inner_text("#error-ports")


def _seen(api: str, headers: dict, job_id: str) -> list[dict]:
    import json

    text = requests.get(f"{api}/jobs/{job_id}/logs", headers=headers, timeout=30).text
    return [json.loads(line.split("SEEN ", 1)[1]) for line in text.splitlines() if "SEEN " in line]


def test_a_shared_port_never_hands_its_viewers_login_to_the_app(hub, new_page):
    """The account takeover of issue 26: an app on a shared port logs what it is sent while a
    victim (and an admin) follow a link to it. The app must see no credential of theirs: no
    cookie of the hub or of gpulab, no token. Its owner still gets the app's own cookie back."""
    import asyncio
    import json

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    from ..conftest import run_async

    attacker = hub.create_user("mal")
    api = f"{hub.url}{SERVICE}/api"
    mal = {"Authorization": f"token {attacker}"}
    r = requests.post(
        f"{api}/jobs",
        headers=mal,
        timeout=30,
        json={
            "name": "bait",
            "framework": "python",
            "command": ["python", "-c", RECORDER],
            "resources": {"gpus": 0, "cpus": 0.5, "memory": "512M"},
            "ports": [{"port": 8080, "name": "web", "users": ["vic"]}],
        },
    )
    assert r.status_code == 201, r.text
    job = r.json()
    url = hub.url + job["ports"][0]["url"]
    wait_until(
        lambda: requests.get(url + "probe", headers=mal, timeout=30).status_code == 200,
        timeout=120,
        what="the attacker's app answering on its port",
    )

    def visit(user: str, admin: bool = False) -> tuple[list[dict], list[str]]:
        """``user`` logs in and follows the link; then a websocket to the app with the same
        browser's cookies. What the app saw of it, and the browser's cookie values."""
        page = new_page()
        login(page, hub, user, admin=admin)
        before = len(_seen(api, mal, job["id"]))
        answer = page.goto(url)
        assert answer is not None and answer.status == 200, user
        assert page.inner_text("#status") in ("loaded", "ws:ok")
        cookies = page.context.cookies()
        # the browser holds gpulab's login cookie for the port's path: it went with the request
        service = [c for c in cookies if c["path"].startswith(SERVICE)]
        assert service, f"{user}'s browser has no gpulab cookie: the test proves nothing"
        jar = "; ".join(f"{c['name']}={c['value']}" for c in cookies)

        async def websocket():
            req = HTTPRequest(
                url.replace("http", "ws", 1) + "ws?token=" + tokens[user],
                headers={"Cookie": jar, "Origin": hub.url},
            )
            conn = await websocket_connect(req)
            assert await asyncio.wait_for(conn.read_message(), 10) == "ws:ok"
            conn.close()

        run_async(websocket())
        seen = wait_until(
            lambda: (got := _seen(api, mal, job["id"])[before:]) and len(got) >= 2 and got,
            timeout=30,
            what=f"the app's record of {user}'s visit",
        )
        return seen, [c["value"] for c in cookies if len(c["value"]) >= 16]

    tokens = {"vic": hub.create_user("vic"), "admin": hub.create_user("admin")}
    for user, admin in (("vic", False), ("admin", True)):
        seen, secrets = visit(user, admin)
        assert {s["kind"] for s in seen} == {"http", "ws"}, seen
        for s in seen:
            text = json.dumps(s)
            assert "Cookie" not in s["headers"], (user, s)
            assert "Authorization" not in s["headers"], (user, s)
            assert "token=" not in s["uri"], (user, s)
            assert tokens[user] not in text
            for secret in secrets:
                assert secret not in text, (user, secret)

    # the owner's browser gets the app's cookie (in the port's own namespace) and the app gets
    # it back under its own name, and nothing else; the websocket opens from the page itself
    page = new_page()
    login(page, hub, "mal")
    before = len(_seen(api, mal, job["id"]))
    page.goto(url)
    page.wait_for_selector("text=ws:ok", timeout=30_000)
    planted = [c for c in page.context.cookies() if "appsession" in c["name"]]
    assert [(c["name"], c["path"]) for c in planted] == [
        (f"gpulab.{job['id']}.web.appsession", job["ports"][0]["url"])
    ]
    page.reload()
    page.wait_for_selector("text=ws:ok", timeout=30_000)
    seen = _seen(api, mal, job["id"])[before:]
    again = [s for s in seen if s["headers"].get("Cookie")]
    assert again and all(s["headers"]["Cookie"] == "appsession=owner-app-cookie" for s in again)
    requests.post(f"{api}/jobs/{job['id']}/interrupt", headers=mal, timeout=30)
