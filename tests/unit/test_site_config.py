"""The site file: jupyterhub_config.py reads it after its defaults, and what the hub and the
service are told follows from its settings (read as the service reads the file, in a process
of its own: the file changes directory and installs log filters)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

READ = textwrap.dedent(
    """
    import json, sys
    from gpulab.settings import GpulabSettings, load_config
    c = load_config(sys.argv[1])
    s = GpulabSettings(config=c)
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    service = next(s for s in c.JupyterHub.services if s["name"] == "gpulab")
    print(json.dumps({
        "bind_url": c.JupyterHub.bind_url,
        "public_url": c.JupyterHub.get("public_url", ""),
        "hub_port": c.JupyterHub.hub_port,
        "db_url": c.JupyterHub.db_url,
        "proxy_api": c.ConfigurableHTTPProxy.api_url,
        "authenticator": str(c.JupyterHub.authenticator_class),
        "admin_users": sorted(c.Authenticator.get("admin_users", [])),
        "admin_role": roles["gpulab-admin"],
        "service_url": service["url"],
        "service_env": service["environment"],
        "database_url": s.database_url,
        "stores": s.object_stores,
        "secrets_key_file": s.secrets_key_file,
        "admin_groups": sorted(s.admin_groups),
        "names": [x["name"] for x in c.JupyterHub.services],
    }))
    """
)


def read(tmp_path: Path, site: str | None, **env: str) -> subprocess.CompletedProcess:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPULAB_") or k == "GPULAB_SYNC_IMAGE"
    }
    environ["PYTHONPATH"] = str(REPO / "src")
    environ["GPULAB_SITE_CONFIG"] = ""
    if site is not None:
        (tmp_path / "site.py").write_text(textwrap.dedent(site))
        environ["GPULAB_SITE_CONFIG"] = str(tmp_path / "site.py")
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", READ, str(REPO / "jupyterhub_config.py")],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def values(tmp_path: Path, site: str | None, **env: str) -> dict:
    done = read(tmp_path, site, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_without_a_site_file_the_environment_gives_the_addresses(tmp_path):
    data = tmp_path / "data"
    got = values(
        tmp_path,
        None,
        GPULAB_DATA_DIR=str(data),
        GPULAB_PORT="8123",
        GPULAB_HUB_PORT="8124",
        GPULAB_PROXY_API_PORT="8125",
        GPULAB_SERVICE_PORT="8126",
    )
    assert got["bind_url"] == "http://127.0.0.1:8123"
    assert got["public_url"] == ""
    assert got["hub_port"] == 8124
    assert got["proxy_api"] == "http://127.0.0.1:8125"
    assert got["service_url"] == "http://127.0.0.1:8126"
    assert got["db_url"] == f"sqlite:///{data / 'jupyterhub.sqlite'}"
    assert got["database_url"] == f"sqlite:///{data / 'gpulab.sqlite'}"
    assert got["stores"] == {"local": {"kind": "filesystem", "root": str(data / "objects")}}
    assert got["secrets_key_file"] == str(data / "secrets.key")
    assert got["service_env"]["GPULAB_DATA_DIR"] == str(data)
    assert got["service_env"]["GPULAB_SITE_CONFIG"] == ""
    # the trial: the shared password, and its admin user is the gpulab admin
    assert got["authenticator"] == "shared-password"
    assert got["admin_role"]["users"] == ["admin"]
    assert got["admin_users"] == ["admin"]  # the hub's admin flag
    assert (data / "passwords.txt").stat().st_mode & 0o777 == 0o600


SITE = """
c.GpulabSettings.data_dir = {data!r}
c.GpulabSettings.bind_url = "http://0.0.0.0:9000"
c.GpulabSettings.public_url = "https://gpulab.example.org/"
c.GpulabSettings.hub_port = 9001
c.GpulabSettings.proxy_api_port = 9002
c.GpulabSettings.service_port = 9003
c.GpulabSettings.admin_groups = {{"gpulab-admins"}}
c.GpulabSettings.database_url = "sqlite:////var/lib/gpulab/gpulab.sqlite"
c.GpulabSettings.object_stores.update({{"s3": {{"endpoint_url": "https://s3.example.org"}}}})
c.JupyterHub.services.append({{"name": "idle-culler", "command": ["true"]}})
c.JupyterHub.authenticator_class = "ldapauthenticator"
c.LDAPAuthenticator.allowed_groups = ["cn=gpulab-users,ou=groups,dc=example,dc=org"]
"""


def test_the_site_file_is_read_after_the_defaults_and_its_settings_are_used(tmp_path):
    data = tmp_path / "state"
    got = values(tmp_path, SITE.format(data=str(data)), GPULAB_PORT="8123")
    assert got["bind_url"] == "http://0.0.0.0:9000"  # the setting wins over GPULAB_PORT
    assert got["public_url"] == "https://gpulab.example.org/"
    assert got["hub_port"] == 9001
    assert got["proxy_api"] == "http://127.0.0.1:9002"
    assert got["service_url"] == "http://127.0.0.1:9003"
    assert got["db_url"] == f"sqlite:///{data / 'jupyterhub.sqlite'}"
    assert got["database_url"] == "sqlite:////var/lib/gpulab/gpulab.sqlite"  # the site's own
    assert got["stores"] == {
        "local": {"kind": "filesystem", "root": str(data / "objects")},
        "s3": {"endpoint_url": "https://s3.example.org"},
    }
    assert got["names"] == ["gpulab", "idle-culler"]
    # the service reads the same site file and data directory as the hub
    assert got["service_env"]["GPULAB_SITE_CONFIG"] == str(tmp_path / "site.py")
    assert got["service_env"]["GPULAB_DATA_DIR"] == str(data)
    # a real authenticator: no trial password, and the admins are the admin groups' members,
    # never a user named admin
    assert got["authenticator"] == "ldapauthenticator"
    assert got["admin_role"]["users"] == []
    assert got["admin_users"] == []
    assert got["admin_role"]["groups"] == ["gpulab-admins"]
    assert not (data / "passwords.txt").exists()


def test_jupyterhubs_own_settings_in_the_site_file_win(tmp_path):
    site = """
    c.JupyterHub.bind_url = "http://10.0.0.5:8000"
    c.JupyterHub.hub_port = 9101
    """
    got = values(tmp_path, site, GPULAB_DATA_DIR=str(tmp_path / "d"), GPULAB_HUB_PORT="8124")
    assert got["bind_url"] == "http://10.0.0.5:8000"
    assert got["hub_port"] == 9101


def test_a_site_file_named_but_missing_stops_the_hub(tmp_path):
    done = read(
        tmp_path,
        None,
        GPULAB_DATA_DIR=str(tmp_path / "d"),
        GPULAB_SITE_CONFIG=str(tmp_path / "nowhere.py"),
    )
    assert done.returncode != 0
    assert f"GPULAB_SITE_CONFIG names {tmp_path / 'nowhere.py'}, which is not a file" in done.stderr
