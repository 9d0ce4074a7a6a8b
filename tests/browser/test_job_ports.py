"""A job's TensorBoard, opened by its owner in headless Chromium through the hub's URL."""

from __future__ import annotations

import re
import time

import requests

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
