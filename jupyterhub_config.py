"""A working gpulab hub: the notebook spawner, the gpulab service and roles.

`make run` starts it on http://127.0.0.1:$GPULAB_PORT (8000). Everything gpulab-specific is
configured on `c.GpulabSettings` (shared by the hub and the service) and `c.NotebookSpawner`.

An installation's own settings live outside the checkout, in a site file loaded after the
defaults below: the file GPULAB_SITE_CONFIG names (empty: none), else
/etc/gpulab/gpulab_config.py when it exists. Where the hub listens and keeps its state are
settings (data_dir, bind_url, public_url, hub_port, proxy_api_port, service_port), read once
the site file is; docs/configuration.md.
"""

import contextlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by JupyterHub's config loader)

here = Path(__file__).parent.resolve()

# in the hub, gpulab's log lines (a notebook's state changes: logger gpulab.state) go to the
# hub's own log; the service (which reads this file too) keeps its own
from gpulab.statelog import follow_hub_log  # noqa: E402

follow_hub_log()
# no token in the hub's log: JupyterHub scrubs ?token= from its access log only, not from
# tornado's other lines about a request (an HTTPError's warning, an uncaught exception's
# error) nor from its own logger's lines (gpulab.logscrub)
from gpulab import logscrub  # noqa: E402

logscrub.install(loggers=(*logscrub.TORNADO_LOGGERS, "JupyterHub"))
logscrub.install_in_hub()  # the hub log's handlers: gpulab's lines reach them unfiltered


def _docker_bridge_gateway() -> str:
    """Notebook containers reach the hub at the bridge gateway (172.17.0.1 by default)."""
    try:
        out = subprocess.run(
            ["docker", "network", "inspect", "bridge", "-f", "{{(index .IPAM.Config 0).Gateway}}"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "172.17.0.1"
    except (OSError, subprocess.SubprocessError):
        return "172.17.0.1"


# --- the hub ---------------------------------------------------------------------------------
# (its addresses and directories: below, once the site file is read)
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 10
# servers survive a hub restart: the hub finds them again from the spawner's saved state
c.JupyterHub.cleanup_servers = False
# A server's activity is what the notebook server itself reports (kernels, a running cell,
# terminals, the editor's authenticated use of its API), not the proxy's traffic: anyone can
# send a notebook's URL requests that the notebook refuses, and the proxy would count them,
# keeping someone else's GPUs from their idle stop (GpulabSettings.gpu_idle_timeout).
c.JupyterHub.last_activity_interval = 0
chp = here / ".build" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
if chp.exists():
    c.ConfigurableHTTPProxy.command = [str(chp)]


# --- log-in -----------------------------------------------------------------------------------
# The trial: a shared password, for local use on 127.0.0.1. Anyone may log in with any user
# name and the shared user password; the admin user (GPULAB_ADMIN_USER, "admin") logs in with
# the admin password (both below, once the site file has said which authenticator it is).
# allow_all and manage_groups are the shared-password authenticator's own: they never apply
# to another one.
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.allow_all = True
c.SharedPasswordAuthenticator.manage_groups = False  # its groups: the hub's (load_groups)
admin = os.environ.get("GPULAB_ADMIN_USER", "admin")
# Real log-in: the site file configures an authenticator (LDAPAuthenticator, OAuthenticator...)
# and who may log in with it (its allowed_groups); the hub refuses to start with allow_all
# (GpulabSettings.allow_any_identity). A user's groups are what the authenticator reports at
# each log-in (manage_groups), and the members of GpulabSettings.admin_groups are the admins,
# never a user named admin: docs/security.md#logging-in.
c.Authenticator.manage_groups = True
from gpulab.hub_login import post_auth_hook, refuse_open_login_at_hub_start  # noqa: E402

c.Authenticator.post_auth_hook = post_auth_hook
refuse_open_login_at_hub_start()

# --- notebooks -------------------------------------------------------------------------------
c.JupyterHub.spawner_class = "gpulab"
# the spawn page's Stop button stops the server the page is about (a notebook waiting there for
# GPUs: docs/notebooks.md#waiting-for-a-gpu), not the user's default one; a site that sets its
# own template_paths keeps them
if "template_paths" not in c.JupyterHub:
    import gpulab  # noqa: E402

    c.JupyterHub.template_paths = [str(Path(gpulab.__file__).parent / "templates" / "hub")]
# the sync helper's image: GPULAB_SYNC_IMAGE, as scripts/build-images.sh names it (default
# gpulab/sync:VERSION)
if os.environ.get("GPULAB_SYNC_IMAGE"):
    c.GpulabSettings.sync_image = os.environ["GPULAB_SYNC_IMAGE"]
# (gpulab's database and the secrets key: in the data directory, below)
# Object storage. The embedded default keeps objects on this host's disk (<data_dir>/objects) and
# persists across restarts; workspaces live there under workspaces/<user>/<server>/. Add S3
# stores by name, with credentials named, never written here, for example:
# c.GpulabSettings.object_stores["s3"] = {
#     "endpoint_url": "https://s3.example.org", "region": "us-east-1",
#     "credentials": {"access_key_env": "S3_KEY_ID", "secret_key_env": "S3_SECRET"},
# }
# c.GpulabSettings.volume_grants.append({"store": "s3", "bucket": "datasets", "modes": ["ro"]})
c.GpulabSettings.object_stores = {"local": {"kind": "filesystem", "root": "{data_dir}/objects"}}
c.GpulabSettings.workspace_store = "local"
c.GpulabSettings.volume_grants = [
    # a shared read-only bucket, and a scratch bucket everyone may read and write
    {"store": "local", "bucket": "shared", "modes": ["ro"]},
    {"store": "local", "bucket": "scratch"},
]
# GPUs of this host: empty means discover them with NVML (nvidia-ml-py, a dependency of gpulab,
# asks the NVIDIA driver's libnvidia-ml.so.1). The hub and the service log what they found at
# start-up, or at WARNING why there is none. For example:
# c.GpulabSettings.gpu_devices = [{"id": "0", "model": "A100", "memory": "80G"}]
# c.GpulabSettings.gpu_mode = "device_request"  # or "env" when the default runtime is nvidia

from gpulab.notebooks.spawner import report_at_hub_start  # noqa: E402

report_at_hub_start()
# c.GpulabSettings.event_loop_watch (off by default): the hub's slow callbacks in its log too
from gpulab.loopwatch import watch_hub_at_start  # noqa: E402

watch_hub_at_start()

# Idle notebooks: GPU notebooks with no activity for an hour are stopped like a user stop
# (workspace pushed, GPUs released, reason IDLE); CPU ones are not. Per flavor, e.g.
# {"id": "gpu-1", ..., "idle_timeout": 1800}; see docs/idle.md.
# c.GpulabSettings.gpu_idle_timeout = 3600
# c.GpulabSettings.cpu_idle_timeout = 0
# jupyterhub-idle-culler (pip install jupyterhub-idle-culler) works beside it, on every server:
# c.JupyterHub.services.append({
#     "name": "idle-culler",
#     "command": [sys.executable, "-m", "jupyterhub_idle_culler", "--timeout=86400"],
# })
# c.JupyterHub.load_roles.append({
#     "name": "idle-culler",
#     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
#     "services": ["idle-culler"],
# })

# --- the gpulab service ----------------------------------------------------------------------
c.JupyterHub.services = [
    {
        "name": "gpulab",
        "url": "",  # on 127.0.0.1:GpulabSettings.service_port (below)
        # the service reads the same configuration file as the hub (GPULAB_CONFIG_FILE names
        # the top-level one when this file is loaded from another with load_subconfig)
        "command": [
            sys.executable,
            "-m",
            "gpulab.service",
            "--config",
            os.environ.get("GPULAB_CONFIG_FILE", str(Path(__file__).resolve())),
        ],
        # a managed service sees only this environment: store credentials named as environment
        # variables must be forwarded (GPULAB_SERVICE_ENV="NAME1,NAME2"); a credentials file
        # needs nothing
        "environment": {
            # (GPULAB_DATA_DIR and GPULAB_SITE_CONFIG: below, so that it reads what the hub read)
            # LD_LIBRARY_PATH: the service finds the NVIDIA driver's library where the hub does;
            # DOCKER_*: it talks to the hub's engine
            **{
                k: os.environ[k]
                for k in (
                    "GPULAB_SYNC_IMAGE",
                    "LD_LIBRARY_PATH",
                    "DOCKER_HOST",
                    "DOCKER_TLS_VERIFY",
                    "DOCKER_CERT_PATH",
                )
                if os.environ.get(k)
            },
            **{
                name: os.environ[name]
                for name in filter(None, os.environ.get("GPULAB_SERVICE_ENV", "").split(","))
                if name in os.environ
            },
        },
        "oauth_no_confirm": True,
        # what a browser session's token may carry to the service (intersected with the user's)
        "oauth_client_allowed_scopes": [
            "custom:gpulab:jobs:read",
            "custom:gpulab:jobs:manage",
            "custom:gpulab:notebooks:read",
            "custom:gpulab:notebooks:manage",
            "custom:gpulab:admin",
        ],
        "display": True,
    }
]
c.JupyterHub.custom_scopes = {
    "custom:gpulab:jobs:read": {
        "description": "Read your own gpulab training jobs, their logs, events and usage.",
    },
    "custom:gpulab:jobs:manage": {
        "description": "Submit, interrupt, resume, rerun and delete your own training jobs.",
        "subscopes": ["custom:gpulab:jobs:read"],
    },
    "custom:gpulab:notebooks:read": {
        "description": "Read the state, history and usage of your own gpulab notebooks.",
    },
    "custom:gpulab:notebooks:manage": {
        "description": "Retry the push of your own gpulab notebooks.",
        "subscopes": ["custom:gpulab:notebooks:read"],
    },
    # the only thing that makes a gpulab admin: the hub's admin flag does not (a token of an
    # admin narrowed to other scopes acts with those scopes only)
    "custom:gpulab:admin": {
        "description": "Read and manage every user's gpulab jobs and notebooks.",
    },
    # for Prometheus: a service token with this scope scrapes /services/gpulab/metrics
    "custom:gpulab:metrics": {
        "description": "Read gpulab's Prometheus metrics (counts and durations, no user data).",
    },
}
c.JupyterHub.load_roles = [
    {
        # the service stops (and restarts) notebooks past their maximum run time, and stops
        # idle ones (it reads their servers' recorded activity)
        "name": "gpulab-service",
        "scopes": ["servers", "read:users", "read:groups"],
        "services": ["gpulab"],
    },
    {
        "name": "user",
        "scopes": [
            "self",
            "access:services!service=gpulab",
            "custom:gpulab:jobs:manage",
            "custom:gpulab:notebooks:manage",
        ],
    },
    {
        "name": "gpulab-admin",
        "scopes": [
            "custom:gpulab:admin",
            "custom:gpulab:jobs:manage",
            "custom:gpulab:notebooks:manage",
        ],
        # the trial's admin user, and the members of GpulabSettings.admin_groups (below)
    },
]


# --- the site's own file, then what follows from its settings ---------------------------------
def _site_file() -> Path | None:
    """GPULAB_SITE_CONFIG's file (empty: none; a name that is no file: an error), else
    /etc/gpulab/gpulab_config.py when it exists."""
    named = os.environ.get("GPULAB_SITE_CONFIG")
    if named is None:
        default = Path("/etc/gpulab/gpulab_config.py")
        return default if default.is_file() else None
    if not named:
        return None
    path = Path(named).resolve()
    if not path.is_file():
        raise SystemExit(f"GPULAB_SITE_CONFIG names {named}, which is not a file")
    return path


site_file = _site_file()
if site_file is not None:
    load_subconfig(str(site_file))  # noqa: F821 (provided by JupyterHub's config loader)

from gpulab.identity import is_shared_password  # noqa: E402
from gpulab.settings import GpulabSettings  # noqa: E402

site = GpulabSettings(config=c, check=False)  # the values as configured so far, else defaults


def _unless_set(section, name: str, value) -> None:
    """A default derived from the site's settings, unless the site set the value itself."""
    if name not in section:
        section[name] = value


data = Path(site.data_dir or here / "data").resolve()
data.mkdir(parents=True, exist_ok=True)
os.chdir(data)  # hub db, cookie secret and proxy pid live here

_unless_set(c.JupyterHub, "bind_url", site.bind_url)
if site.public_url:
    _unless_set(c.JupyterHub, "public_url", site.public_url)
# the proxies in front (the hub's own, a TLS front door): the hub logs the browser's address
_unless_set(c.JupyterHub, "trusted_downstream_ips", list(site.trusted_proxies))
if site.public_url.lower().startswith("https:"):
    # behind the HTTPS front door (deploy/nginx/gpulab.conf, docs/https.md): JupyterHub marks
    # its log-in cookie Secure from public_url, and these options the rest: its XSRF cookie,
    # and (passed to each notebook as JUPYTERHUB_COOKIE_OPTIONS) the notebook's own cookies.
    # The gpulab service marks its cookies from the scheme its trusted proxies forward.
    _tornado = dict(c.JupyterHub.tornado_settings) if "tornado_settings" in c.JupyterHub else {}
    _tornado["cookie_options"] = {"secure": True, **_tornado.get("cookie_options", {})}
    c.JupyterHub.tornado_settings = _tornado
    # and the notebook server's XSRF cookie, which it sets with its own tornado settings
    _args = [
        *(c.NotebookSpawner.args if "args" in c.NotebookSpawner else ()),
        *(c.Spawner.args if "args" not in c.NotebookSpawner and "args" in c.Spawner else ()),
    ]
    if not any(str(a).startswith("--ServerApp.tornado_settings") for a in _args):
        _args.append('--ServerApp.tornado_settings={"xsrf_cookie_kwargs": {"secure": True}}')
    c.NotebookSpawner.args = _args
# the hub API listens on the docker bridge only: reachable by notebook containers, not outside
gateway = _docker_bridge_gateway()
_unless_set(c.JupyterHub, "hub_ip", gateway)
_unless_set(c.JupyterHub, "hub_port", site.hub_port)
_unless_set(c.JupyterHub, "hub_connect_ip", gateway)
_unless_set(c.JupyterHub, "db_url", f"sqlite:///{data / 'jupyterhub.sqlite'}")
_unless_set(c.JupyterHub, "cookie_secret_file", str(data / "jupyterhub_cookie_secret"))
# a stable proxy token, so that a restarted hub can talk to the proxy that kept running
token_file = data / "proxy_auth_token"
if not token_file.exists():
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
_unless_set(c.ConfigurableHTTPProxy, "auth_token", token_file.read_text().strip())
_unless_set(c.ConfigurableHTTPProxy, "api_url", f"http://127.0.0.1:{site.proxy_api_port}")

_unless_set(c.GpulabSettings, "database_url", f"sqlite:///{data / 'gpulab.sqlite'}")
_local = c.GpulabSettings.object_stores.get("local")
if isinstance(_local, dict) and _local.get("root") == "{data_dir}/objects":
    _local["root"] = str(data / "objects")
# Users' secrets are encrypted at rest with this Fernet key (generated once, mode 0600). Keep a
# copy apart from the backups (`gpulab admin backup` leaves it out unless asked): without it the
# secrets cannot be decrypted (docs/upgrading.md#back-up-and-restore).
if "secrets_key_file" not in c.GpulabSettings:
    _key_file = data / "secrets.key"
    if not _key_file.exists():
        from cryptography.fernet import Fernet

        with contextlib.suppress(FileExistsError):  # the hub and the service read this file
            fd = os.open(_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(Fernet.generate_key().decode() + "\n")
    c.GpulabSettings.secrets_key_file = str(_key_file)

# (the site file may have added to the lists and dicts above: they are copies by now)
for _service in c.JupyterHub.services:
    if _service.get("name") == "gpulab":
        _service["url"] = f"http://127.0.0.1:{site.service_port}"
        _service["environment"]["GPULAB_DATA_DIR"] = str(data)
        _service["environment"]["GPULAB_SITE_CONFIG"] = str(site_file or "")


# The trial's passwords come from the environment or are generated once into
# <data_dir>/passwords.txt (mode 0600).
def _passwords() -> dict[str, str]:
    path = data / "passwords.txt"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(f"user={secrets.token_urlsafe(12)}\nadmin={secrets.token_urlsafe(32)}\n")
    return dict(line.split("=", 1) for line in path.read_text().split())


trial = is_shared_password(c.JupyterHub.authenticator_class)
if trial:
    _unless_set(c.Authenticator, "admin_users", {admin})
    _pw = _passwords()
    c.SharedPasswordAuthenticator.user_password = os.environ.get(
        "GPULAB_USER_PASSWORD", _pw["user"]
    )
    c.SharedPasswordAuthenticator.admin_password = os.environ.get(
        "GPULAB_ADMIN_PASSWORD", _pw["admin"]
    )
# gpulab admins: the members of admin_groups, and in the trial its admin user; with a real
# authenticator a user's name never makes an admin
for _role in c.JupyterHub.load_roles:
    if _role.get("name") == "gpulab-admin":
        _role["users"] = [admin] if trial else []
        _role["groups"] = sorted(site.admin_groups)
