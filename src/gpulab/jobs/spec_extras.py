"""The job fields that reach into a running job: exposed ports, secret references in the
environment, the working directory and a read-only root file system.

Parsers in the style of :mod:`gpulab.jobs.spec_fields` (each checks its caps first and names
the dotted field at fault); :mod:`gpulab.jobs.spec` puts them together.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..bounds import shown
from .spec_fields import JobSpecError

#: ports one job may expose, and who besides its owner may open one
MAX_PORTS = 8
MAX_SHARE_NAMES = 32
MAX_PATH_CHARS = 1024
#: the names of the hub's users and groups in a port's share list
MAX_PRINCIPAL_CHARS = 255
PORT_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,31}")
_PORT_FIELDS = ("port", "name", "users", "groups")


@dataclass(frozen=True)
class Port:
    """A port of the job's container opened at ``/services/gpulab/jobs/ID/ports/NAME/``."""

    port: int
    name: str
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "port": self.port,
            "name": self.name,
            "users": list(self.users),
            "groups": list(self.groups),
        }

    @classmethod
    def from_json(cls, d: Mapping) -> Port:
        return cls(
            port=int(d["port"]),
            name=str(d["name"]),
            users=tuple(d.get("users") or ()),
            groups=tuple(d.get("groups") or ()),
        )

    @property
    def env_name(self) -> str:
        """``tensorboard`` -> ``TENSORBOARD``: the stem of the variables that tell the job."""
        return self.name.upper().replace("-", "_")

    def may_open(self, user: str, groups) -> bool:
        """Whether ``user`` (not the owner, not an admin) is among those it is shared with."""
        return user in self.users or bool(set(groups or ()) & set(self.groups))


@dataclass(frozen=True)
class EnvSplit:
    """A job's environment: plain values, and the variables filled from the owner's secrets."""

    plain: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # variable -> secret name


def _names(value: object, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise JobSpecError(key, f"{key} must be a list of names, not {shown(value)}")
    if len(value) > MAX_SHARE_NAMES:
        raise JobSpecError(key, f"{key}: at most {MAX_SHARE_NAMES} names (got {len(value)})")
    for v in value:
        if not isinstance(v, str) or not v or len(v) > MAX_PRINCIPAL_CHARS or "\0" in v:
            raise JobSpecError(
                key, f"{key}: each name is a string of 1 to {MAX_PRINCIPAL_CHARS} characters"
            )
    return tuple(dict.fromkeys(value))


def parse_ports(raw: Mapping) -> tuple[Port, ...]:
    value = raw.get("ports")
    if value is None or value == []:
        return ()
    help_ = 'ports must be a list such as [{"port": 6006, "name": "tensorboard"}]'
    if not isinstance(value, list):
        raise JobSpecError("ports", help_)
    if len(value) > MAX_PORTS:
        raise JobSpecError("ports", f"ports: at most {MAX_PORTS} entries (got {len(value)})")
    out: list[Port] = []
    for i, entry in enumerate(value):
        key = f"ports[{i}]"
        if not isinstance(entry, Mapping):
            raise JobSpecError(key, help_)
        unknown = next((k for k in entry if k not in _PORT_FIELDS), None)
        if unknown is not None:
            raise JobSpecError(
                f"{key}.{str(unknown)[:64]}",
                f"unknown field {shown(unknown)}; a port takes: {', '.join(_PORT_FIELDS)}",
            )
        number = entry.get("port")
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        if isinstance(number, bool) or not isinstance(number, int) or not 1024 <= number <= 65535:
            raise JobSpecError(
                f"{key}.port",
                f"{key}.port must be a whole number from 1024 to 65535 (the job runs as an "
                f"ordinary user, which cannot listen below 1024), not {shown(number)}",
            )
        name = entry.get("name")
        if not isinstance(name, str) or not PORT_NAME_RE.fullmatch(name):
            raise JobSpecError(
                f"{key}.name",
                f"{key}.name must be 1 to 32 lowercase letters, digits or '-', starting with a "
                f"letter (it is part of the URL), not {shown(name)}",
            )
        if any(p.name == name for p in out):
            raise JobSpecError(f"{key}.name", f"port name {name!r} is given twice")
        if any(p.port == number for p in out):
            raise JobSpecError(f"{key}.port", f"port {number} is given twice")
        out.append(
            Port(
                number,
                name,
                _names(entry.get("users"), f"{key}.users"),
                _names(entry.get("groups"), f"{key}.groups"),
            )
        )
    return tuple(out)


def secret_reference(value: Mapping, key: str) -> str:
    """``{"secret": "wandb"}`` -> ``"wandb"`` (the name's syntax checked here; whether the
    owner has it, by the caller that knows)."""
    from ..secrets import SecretError, check_name

    unknown = next((k for k in value if k != "secret"), None)
    if unknown is not None:
        raise JobSpecError(
            key,
            f'{key} must be a string or {{"secret": NAME}}; unknown field {shown(unknown)}',
        )
    try:
        return check_name(value.get("secret"), key)
    except SecretError as e:
        raise JobSpecError(key, f"{key}: {e}") from None


def env_entries(value: object) -> object:
    """The environment as an object: the list form ``[{"name": N, "value": V}`` or ``{"name":
    N, "secret": S}]`` (Kubernetes' and Run:ai's shape) becomes ``{N: V, N: {"secret": S}}``;
    an object comes back as it is (the caller checks it)."""
    if not isinstance(value, list):
        return value
    out: dict = {}
    for i, entry in enumerate(value[:1024]):
        key = f"env[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise JobSpecError(
                key,
                f'{key} must be {{"name": NAME, "value": TEXT}} or {{"name": NAME, '
                '"secret": SECRET}}',
            )
        extra = next((k for k in entry if k not in ("name", "value", "secret")), None)
        if extra is not None or ("value" in entry) == ("secret" in entry):
            raise JobSpecError(key, f"{key} takes name and one of value or secret")
        name = entry["name"]
        if name in out:
            raise JobSpecError(key, f"environment variable {shown(name)} is given twice")
        out[name] = entry["value"] if "value" in entry else {"secret": entry["secret"]}
    if len(value) > 1024:
        out["\0too many"] = ""  # over any cap: spec_fields' count check refuses it
    return out


def parse_working_dir(raw: Mapping) -> str | None:
    """An absolute, normalized path outside the system's trees (the same rule as a git
    checkout's path: :data:`~gpulab.jobs.spec_git.SYSTEM_DIRS`)."""
    from .spec_git import SYSTEM_DIRS

    value = raw.get("working_dir")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_PATH_CHARS or "\0" in value:
        raise JobSpecError(
            "working_dir",
            f"working_dir must be an absolute path of at most {MAX_PATH_CHARS} characters",
        )
    if not value.startswith("/") or posixpath.normpath(value) != value or "//" in value:
        raise JobSpecError(
            "working_dir",
            f"working_dir must be an absolute, normalized path such as /workspace/src, not "
            f"{shown(value)}",
        )
    if value == "/" or any(value == d or value.startswith(d + "/") for d in SYSTEM_DIRS):
        raise JobSpecError(
            "working_dir", f"working_dir {value!r} is a system directory: use /workspace/..."
        )
    return value


def parse_read_only(raw: Mapping) -> bool:
    value = raw.get("read_only_rootfs")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise JobSpecError(
            "read_only_rootfs", f"read_only_rootfs must be true or false, not {shown(value)}"
        )
    return value


def job_path(job_id: str) -> str:
    """The job's URL path under the hub (its ports live below it): the service's prefix, as
    the hub gives it to the service (the supervisor runs in the service's process)."""
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulab/")
    return f"{prefix.rstrip('/')}/jobs/{job_id}"


def port_env(ports: tuple[Port, ...], base: str) -> dict[str, str]:
    """What a job is told of its ports: ``GPULAB_PORT_<NAME>=6006`` and
    ``GPULAB_PORT_<NAME>_PATH=/services/gpulab/jobs/ID/ports/NAME`` (no trailing slash: what
    TensorBoard's ``--path_prefix`` and most apps' base-path options take). ``base`` is the
    job's URL path ``.../jobs/ID``."""
    env = {}
    for p in ports:
        env[f"GPULAB_PORT_{p.env_name}"] = str(p.port)
        env[f"GPULAB_PORT_{p.env_name}_PATH"] = f"{base.rstrip('/')}/ports/{p.name}"
    return env


#: JSON Schema of one ``{"secret": NAME}`` reference (an env value)
SECRET_REF_SCHEMA: dict = {
    "type": "object",
    "required": ["secret"],
    "additionalProperties": False,
    "properties": {
        "secret": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,62}$", "maxLength": 63}
    },
    "description": "The value of one of your secrets (gpulab secret set NAME).",
}

_SHARE_NAMES = {
    "type": ["array", "null"],
    "maxItems": MAX_SHARE_NAMES,
    "items": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_PRINCIPAL_CHARS,
        "pattern": "^[^\\x00]*$",
    },
}

#: JSON Schema of the ``ports`` field
PORTS_SCHEMA: dict = {
    "type": ["array", "null"],
    "maxItems": MAX_PORTS,
    "items": {
        "type": "object",
        "required": ["port", "name"],
        "additionalProperties": False,
        "properties": {
            "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
            "name": {"type": "string", "pattern": f"^{PORT_NAME_RE.pattern}$", "maxLength": 32},
            "users": {**_SHARE_NAMES, "description": "Hub users who may open it too."},
            "groups": {**_SHARE_NAMES, "description": "Hub groups whose members may open it."},
        },
    },
    "description": "Ports of the job's container opened under the hub at "
    "/services/gpulab/jobs/ID/ports/NAME/ for its owner, admins and the users and groups "
    "named (behind the hub's login; HTTP and websockets). The job is told each one's path in "
    "GPULAB_PORT_<NAME>_PATH (for TensorBoard: --path_prefix $GPULAB_PORT_TENSORBOARD_PATH).",
}
