"""Backups and restores (issue 29 item 7): ``gpulab admin backup`` takes a consistent copy of
the hub's and gpulab's databases while a job runs and a notebook starts, and ``gpulab admin
restore`` puts it into a fresh data directory, where a new hub finds the users, their API
tokens, the job's history, the ledger's rows and a user's secret (decryptable with the kept
key). A real hub, the gpulab service, the Docker engine; the programs as an operator runs them."""

from __future__ import annotations

import concurrent.futures
import json
import os
import sqlite3
import subprocess
import sys

import pytest
import requests

from gpulab.db import Database
from gpulab.secrets import SecretStore, load_keys

from ..support.api import TERMINAL, Api

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
"""
LEDGER = "SELECT device, kind, owner, workload FROM gpu_allocations ORDER BY kind, device"
SECRET = "hf-t0ken-" + "q9" * 16


def admin(hub, *args: str) -> subprocess.CompletedProcess:
    """``gpulab admin ARGS`` run on the hub's host, with the hub's configuration and data
    directory, as its operator would."""
    env = {
        **os.environ,
        "GPULAB_DATA_DIR": str(hub.workdir / "data"),
        "GPULAB_CONFIG_FILE": str(hub.config_file),
        "GPULAB_SITE_CONFIG": "",
    }
    return subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "admin", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def rows(path, query: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def test_a_backup_taken_while_work_runs_restores_into_a_fresh_data_directory(hub_with, tmp_path):
    hub = hub_with(CONFIG, fresh=True)
    owner = Api(hub, "owner")  # its token is made before the backup
    assert owner.call("PUT", "/secrets/hf", json={"value": SECRET}).status_code == 201
    job = owner.submit(
        name="long",
        framework="python",
        command=["sleep", "600"],
        resources={"gpus": 1, "cpus": 0.5, "memory": "512M"},
    )
    running = owner.wait(job["id"], {"RUNNING", *TERMINAL})
    assert running["state"] == "RUNNING", running
    options = {"framework": "python", "flavor": "gpu-1"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        spawn = pool.submit(hub.spawn, "owner", "nb", options, token=owner.token)
        hub.wait_state("owner", "nb", "STARTING")  # the backup while the notebook starts
        dest = tmp_path / "backup"
        done = admin(hub, "backup", str(dest))
        notebook = hub.notebook("owner", "nb").json()
        assert spawn.result().status_code in (201, 202), spawn.result().text
    assert done.returncode == 0, done.stderr
    assert "secrets key is NOT in this backup" in done.stdout, done.stdout
    key_file = hub.workdir / "data" / "secrets.key"
    assert str(key_file) in done.stdout and key_file.read_text().strip() not in done.stdout
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["databases"]["hub"]["file"] == "jupyterhub.sqlite"
    assert manifest["databases"]["gpulab"]["file"] == "gpulab.sqlite"
    assert manifest["gpulab_version"] and manifest["jupyterhub_version"]
    assert not (dest / "secrets.key").exists()

    # the copy holds what ran at the time: the job RUNNING on its GPU, the starting notebook
    copy = dest / "gpulab.sqlite"
    assert rows(copy, f"SELECT state FROM jobs WHERE id = '{job['id']}'") == [("RUNNING",)]
    held = rows(copy, LEDGER)
    assert ("job", "owner") in {(k, o) for _, k, o, _ in held}, held
    # taken while the notebook started: STARTING, or RUNNING where its start ended before the
    # copy was (the backup takes a second, a start about as long); never torn or missing
    ((user, server, state),) = rows(copy, "SELECT user, server, state FROM notebooks")
    assert (user, server) == ("owner", "nb") and state in ("STARTING", "RUNNING"), state
    history = owner.job(job["id"])["history"]

    hub.wait_ready("owner", "nb", timeout=180)
    hub.stop()
    hub.remove_workloads()

    restored = hub_with(CONFIG, start=False)
    restored.instance = hub.instance
    data = restored.workdir / "data"
    (data / "leftover").mkdir(parents=True)
    refused = admin(restored, "restore", str(dest), str(data))
    assert refused.returncode == 1 and "is not empty" in refused.stderr
    (data / "leftover").rmdir()
    kept = tmp_path / "kept.key"  # the operator's copy, kept apart from the backup
    kept.write_text(key_file.read_text())
    done = admin(restored, "restore", str(dest), str(data), "--key", str(kept))
    assert done.returncode == 0, done.stderr
    assert (data / "secrets.key").stat().st_mode & 0o777 == 0o600

    # before any hub touches it: the ledger's rows and the secret as they were
    restored_db = data / "gpulab.sqlite"
    assert rows(restored_db, LEDGER) == held
    store = SecretStore(
        Database(f"sqlite:///{restored_db}"), hub.instance, load_keys([], str(data / "secrets.key"))
    )
    assert store.reveal("owner", "hf") == SECRET

    restored.start()
    # the user and the API token made before the backup
    me = requests.get(
        f"{restored.api}/user", headers={"Authorization": f"token {owner.token}"}, timeout=30
    )
    assert me.status_code == 200 and me.json()["name"] == "owner", me.text
    again = Api.__new__(Api)
    again.hub, again.user, again.token = restored, "owner", owner.token
    again.base = f"{restored.url}/services/gpulab/api"
    # the job's history up to the backup, kept as it was
    after = again.job(job["id"])
    assert after["history"][: len(history)] == history
    assert [s["name"] for s in again.call("GET", "/secrets").json()["secrets"]] == ["hf"]
    nb = restored.notebook("owner", "nb", token=owner.token)
    assert nb.status_code == 200, nb.text
    assert nb.json()["history"][0] == notebook["history"][0]
