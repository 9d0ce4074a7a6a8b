"""A share of a GPU from the spawn form, in a real headless Chromium: the form says which
shares are offered and what is free, a notebook starts on half of the shared GPU, and the
gpulab home page and the admin GPU view show the fraction (conftest.HUB_CONFIG shares GPU 1
in halves and offers the flavor gpu-half)."""

from __future__ import annotations

import re

import pytest

from .conftest import login

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SERVICE = "/services/gpulab/"


def test_half_a_gpu_from_the_form(hub, new_page, shots, docker_client):
    page = new_page()
    login(page, hub, "sal")
    page.goto(f"{hub.url}/hub/spawn/sal/half")
    page.wait_for_selector("#gpulab-gpu-shares")
    hint = page.inner_text("#gpulab-gpu-shares")
    assert "a notebook may ask for 0.5 of a GPU" in hint
    assert "GPU 1: 2 of 2 slots free" in hint
    assert "nothing stops another notebook" in hint  # time-slicing: said plainly
    assert "without isolation" in hint and "it limits no one" in hint and "MPS" not in hint
    assert "2 of 2 free now" in page.inner_text("#gpulab-gpus-free")
    page.select_option("#gpulab-framework", "python")
    page.select_option("#gpulab-flavor", "gpu-half")
    shots(page, "spawn-form-gpu-share")
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(r".*/user/sal/half/lab.*"), timeout=120_000)

    # the container was given GPU 1, as a whole GPU is, and told its share
    nb = hub.notebook("sal", "half").json()
    env = dict(
        e.split("=", 1)
        for e in docker_client.containers.get(nb["container"]).attrs["Config"]["Env"]
    )
    assert env["NVIDIA_VISIBLE_DEVICES"] == "1" and env["GPULAB_GPU_FRACTION"] == "0.5"
    assert nb["options"]["resources"]["gpus"] == 0.5

    # the home page: the notebook's resources and what is left of the shared GPU
    page.goto(hub.url + SERVICE)
    row = page.locator('tr[data-notebook="half"]')
    row.wait_for()
    assert "0.5 GPU" in row.inner_text()
    assert "shared GPU 1: 1 of 2 slots free" in page.inner_text("#gpu-shares")
    shots(page, "home-gpu-share")

    # another user's form: one slot left, and both whole GPUs still free
    other = new_page()
    login(other, hub, "tim")
    other.goto(f"{hub.url}/hub/spawn/tim/x")
    other.wait_for_selector("#gpulab-gpu-shares")
    assert "GPU 1: 1 of 2 slots free" in other.inner_text("#gpulab-gpu-shares")
    assert "1 of 2 free now" in other.inner_text("#gpulab-gpus-free")

    # the admin GPU view: GPU 1 is held by sal's notebook, half of it, one slot free
    admin = new_page()
    login(admin, hub, "admin", admin=True)
    admin.goto(f"{hub.url}{SERVICE}admin")
    admin.wait_for_selector("#gpu-table")
    rows = admin.locator('#gpu-table tr[data-device="1"]')
    text = rows.all_inner_texts()
    assert any("notebook sal/half" in t and "0.5 GPU" in t and "slot 1 of 2" in t for t in text), (
        text
    )
    assert any("shared: 1 of 2 slots free" in t for t in text), text
    shots(admin, "admin-gpu-share")
    hub.stop_server("sal", "half")
