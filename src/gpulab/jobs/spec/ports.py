"""The ``ports`` field of a job: ports of its container opened under the hub for its owner
and those it shares them with, and what the job is told of them.

A parser in the style of :mod:`gpulab.jobs.spec.fields` (it checks its caps first and names
the dotted field at fault); :mod:`gpulab.jobs.spec.submission` puts the fields together.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ...bounds import shown
from .base import JobSpecError

#: ports one job may expose, and who besides its owner may open one
MAX_PORTS = 8
MAX_SHARE_NAMES = 32
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
