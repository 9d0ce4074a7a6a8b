"""TensorFlow and JAX notebooks run real computations in their kernels; a framework version
whose image is not built is shown unavailable in the form and refused with a 400, never failed
at spawn (a job naming it is queued: the image may be built before it starts)."""

from __future__ import annotations

import re

import pytest
import requests

from ..conftest import wait_until
from ..support.hub import login
from ..support.kernels import run_code

pytestmark = [pytest.mark.docker, pytest.mark.hub]

# the default catalog, plus a framework whose image nobody built
CONFIG = """
from gpulab.settings import DEFAULT_FRAMEWORKS
c.GpulabSettings.frameworks = [
    *DEFAULT_FRAMEWORKS,
    {"id": "ghost", "title": "Ghost", "versions": [{"id": "1", "image": "gpulab/ghost:1"}],
     "editors": ["jupyterlab"]},
    {"id": "mixed", "title": "Mixed",
     "versions": [{"id": "new", "image": "gpulab/ghost:2"}, {"id": "old", "image": "gpulab/python:3.11"}],
     "editors": ["jupyterlab"]},
]
c.GpulabSettings.supervisor_interval = 0.2
"""
SMALL = {"flavor": "cpu-small"}


@pytest.fixture(scope="module")
def hub(hub_with, framework_images):
    return hub_with(CONFIG)


@pytest.mark.parametrize(
    ("framework", "code", "expected"),
    [
        (
            "tensorflow",
            "import tensorflow as tf\n"
            "a = tf.constant([[1.0, 2.0], [3.0, 4.0]]); b = tf.constant([[5.0], [6.0]])\n"
            "print(tf.__version__, float(tf.linalg.matmul(a, b)[1][0]))",
            "2.20.0 39.0",
        ),
        (
            "jax",
            "import jax, jax.numpy as jnp\n"
            "f = jax.jit(lambda x: (x @ x.T).sum())\n"
            "print(jax.__version__, float(f(jnp.arange(6.0).reshape(2, 3))), jax.devices()[0].platform)",
            "0.7.0 83.0 cpu",
        ),
    ],
)
def test_a_framework_notebook_computes_in_its_kernel(hub, framework, code, expected):
    token = hub.create_user(f"u{framework}")
    user = f"u{framework}"
    r = hub.spawn(user, framework, {**SMALL, "framework": framework}, token=token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, framework, timeout=240)
    assert run_code(hub, user, framework, token, code, timeout=180).strip() == expected
    hub.stop_server(user, framework)


def test_a_version_whose_image_is_missing_is_unavailable_not_a_failed_spawn(hub):
    token = hub.create_user("gus")
    # the form: the version is listed, marked and not selectable, with the reason
    form = login(hub, "gus").get(f"{hub.url}/hub/spawn/gus/x", timeout=60)
    assert form.status_code == 200, form.text[:300]
    ghost = re.search(r'<option value="ghost"[^>]*>[^<]*</option>', form.text)
    assert ghost and "disabled" in ghost.group(0) and "unavailable" in ghost.group(0), ghost
    new = re.search(r'<option value="new" data-framework="mixed"[^>]*>[^<]*</option>', form.text)
    assert new and 'data-missing="1"' in new.group(0), new
    assert "gpulab/ghost:2 is missing on this host" in new.group(0)
    old = re.search(r'<option value="old" data-framework="mixed"[^>]*>', form.text)
    assert old and "data-missing" not in old.group(0)
    for fw in ("tensorflow", "jax", "pytorch", "python"):  # the built ones are offered
        opt = re.search(rf'<option value="{fw}"[^>]*>', form.text)
        assert opt and "disabled" not in opt.group(0), opt

    # the REST API: a 400 naming the version and the image, and nothing started
    r = hub.spawn("gus", "g", {**SMALL, "framework": "ghost"}, token=token)
    assert r.status_code == 400, r.text
    assert "version: Ghost 1 is unavailable: its image gpulab/ghost:1 is missing" in r.text
    r = hub.spawn("gus", "g", {**SMALL, "framework": "mixed", "version": "new"}, token=token)
    assert r.status_code == 400 and "gpulab/ghost:2" in r.text, r.text
    assert hub.server_model("gus", "g") is None or not hub.server_model("gus", "g").get("ready")
    nb = hub.notebook("gus", "g")
    assert nb.status_code == 404 or nb.json()["state"] not in ("ERROR", "FAILED"), nb.text

    # a job naming it is queued as before: a queue may start it after the admin has built the
    # image; if the image is still missing then, the job ends FAILED (IMAGE_MISSING)
    r = requests.post(
        f"{hub.url}/services/gpulab/api/jobs",
        headers={"Authorization": f"token {token}"},
        json={"command": "true", "framework": "ghost", "resources": {"gpus": 0}},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    job = r.json()["id"]

    def ended():
        j = requests.get(
            f"{hub.url}/services/gpulab/api/jobs/{job}",
            headers={"Authorization": f"token {token}"},
            timeout=30,
        ).json()
        return j if j["state"] == "FAILED" else None

    failed = wait_until(ended, timeout=60, what=f"job {job} FAILED")
    assert failed["reason"] == "IMAGE_MISSING" and "gpulab/ghost:1" in failed["message"], failed
