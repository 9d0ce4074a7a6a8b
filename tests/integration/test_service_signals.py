"""The gpulab service obeys the hub's SIGINT (how JupyterHub stops a managed service) even
when it inherited SIGINT ignored, as every process below a hub started by a shell without job
control does (`jupyterhub &` in a script, nohup, a CI runner)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.ports import free_port


def test_the_service_ends_at_once_on_sigint_even_when_inherited_ignored(tmp_path):
    config = tmp_path / "config.py"
    config.write_text(
        "c = get_config()  # noqa\n"
        f"c.GpulabSettings.database_url = 'sqlite:///{tmp_path / 'gpulab.sqlite'}'\n"
        "c.GpulabSettings.instance = 'tsignals'\n"
    )
    port = free_port()
    env = dict(
        os.environ,
        JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{port}",
        JUPYTERHUB_API_URL=f"http://127.0.0.1:{free_port()}/hub/api",
        JUPYTERHUB_API_TOKEN="unused",
        GPULAB_DATA_DIR=str(tmp_path),
    )
    log = tmp_path / "service.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpulab.service", "--config", str(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0, log.read_text()
        assert time.monotonic() - sent < 5
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
