"""The fields of a job submission, one parser per field, and the value checks they share
(pure). :mod:`gpulab.jobs.spec.submission` puts them together with the ports
(:mod:`~gpulab.jobs.spec.ports`) and the git repositories (:mod:`~gpulab.jobs.spec.git`).

Each parser checks its caps (:mod:`gpulab.bounds`) before any work that grows with its input
(parsing each volume, comparing mounts, resolving resources), and echoes refused values
through :func:`~gpulab.bounds.shown`: a refused 1 MiB value is not sent back.
"""

from __future__ import annotations

import math
import posixpath
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import checks
from ...bounds import (
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ITEMS,
    MAX_ENV,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_BYTES,
    MAX_ID_CHARS,
    MAX_IMAGE_CHARS,
    MAX_NAME_CHARS,
    MAX_NUMBER_CHARS,
    check_chars,
    check_count,
    shown,
    size_text,
)
from ...checks import first_unknown, key_text, type_name
from ...durations import DurationError, format_duration, parse_duration
from ...frameworks import Catalog
from ...resources import Flavor, Limits, Resources, beyond_gpus
from ...storage import StorageConfig
from ...volumes import VolumeSpec
from .base import (
    BLANK_CLASS,
    DEFAULT_CPUS,
    DEFAULT_GPUS,
    DEFAULT_HANG_PERIOD,
    DEFAULT_MEMORY,
    DEFAULT_PRIORITY,
    DEFAULT_TIMEOUT,
    ENV_NAME_RE,
    HANG_RESTART_FIELDS,
    JOB_SPEC_FIELDS,
    MAX_PATH_CHARS,
    MAX_PRIORITY,
    MAX_RETENTION,
    MAX_RETRIES,
    MAX_WORKERS,
    MIN_HANG_PERIOD,
    MIN_RETENTION,
    NAME_RE,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESOURCE_FIELDS,
    SYSTEM_DIRS,
    WORKSPACE_DIR,
    JobSpecError,
    secret_name,
)

_BLANK_RE = re.compile(f"[{BLANK_CLASS}]*")
_JOB_SPEC_FIELD_SET = frozenset(JOB_SPEC_FIELDS)
_RESOURCE_FIELD_SET = frozenset(RESOURCE_FIELDS)
_HANG_RESTART_FIELD_SET = frozenset(HANG_RESTART_FIELDS)


def _optional_text(raw: Mapping, key: str, cap: int = MAX_ID_CHARS) -> str | None:
    """None and "" mean absent; anything else must be a string of at most ``cap`` characters."""
    return checks.optional_text(JobSpecError, key, raw.get(key), cap)


def _whole(value: object) -> object:
    """A float with a whole value (``45.0``) as the integer it is: JSON (and JSON Schema's
    ``integer``) does not tell ``45.0`` from ``45``. Anything else as it came."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _integer(value: object, key: str, low: int, high: int) -> int:
    value = _whole(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(
            key, f"{key} must be a whole number from {low} to {high}, not {shown(value)}"
        )
    if not low <= value <= high:
        raise JobSpecError(key, f"{key} must be from {low} to {high}, got {shown(value)}")
    return value


def _duration(value: object, key: str, low: float, high: float) -> float:
    if isinstance(value, str):
        check_chars(JobSpecError, key, value, MAX_NUMBER_CHARS)
    try:
        seconds = parse_duration(value, key)  # type: ignore[arg-type]
    except DurationError as e:
        raise JobSpecError(e.field, str(e)) from None
    if seconds < low:
        raise JobSpecError(
            key, f"{key} must be at least {format_duration(low)}, got {shown(value)}"
        )
    if seconds > high:
        raise JobSpecError(
            key, f"{key} must be at most {format_duration(high)}, got {shown(value)}"
        )
    return seconds


def _strings(value: object, key: str, room: int) -> tuple[str, ...]:
    """A list of at most ``room`` strings without NUL characters."""
    if not isinstance(value, list | tuple):
        raise JobSpecError(key, f"{key} must be a list of strings, not {shown(value)}")
    if len(value) > room:
        raise JobSpecError(
            key,
            f"{key}: at most {MAX_COMMAND_ITEMS} entries in command and args together "
            f"(got {MAX_COMMAND_ITEMS - room + len(value)})",
        )
    for s in value:
        if not isinstance(s, str):
            raise JobSpecError(key, f"{key} must be a list of strings, not {shown(value)}")
        if "\0" in s:
            raise JobSpecError(key, f"{key} must not contain NUL characters")
    return tuple(value)


@dataclass(frozen=True)
class HangRestart:
    """Restart the command when the job makes no progress for ``period`` seconds."""

    enabled: bool = False
    period: float = DEFAULT_HANG_PERIOD

    def to_json(self) -> dict:
        return {"enabled": self.enabled, "period": self.period}


def _name(raw: Mapping) -> str | None:
    name = raw.get("name")
    if name is None or name == "":
        return None
    if not isinstance(name, str):
        raise JobSpecError("name", checks.not_text("name", name))
    # the length first, then the pattern matched in full: "train\n" is not a name
    if len(name) > MAX_NAME_CHARS or not NAME_RE.fullmatch(name):
        raise JobSpecError(
            "name",
            f"name must be 1 to {MAX_NAME_CHARS} lowercase letters, digits or '-', starting with "
            f"a letter, not {shown(name)}",
        )
    return name


def _command(raw: Mapping) -> tuple[tuple[str, ...], tuple[str, ...]]:
    value = raw.get("command")
    help_ = "command must be a non-empty list of strings, or one string run with sh -c"
    if value is None or (isinstance(value, str | list | tuple) and len(value) == 0):
        raise JobSpecError("command", f"a job needs a command: {help_}")
    if isinstance(value, str):
        if len(value) > MAX_COMMAND_BYTES:
            raise JobSpecError(
                "command",
                f"command: at most {size_text(MAX_COMMAND_BYTES)} with its args (got "
                f"{len(value)} characters); pass large inputs through a volume",
            )
        if _BLANK_RE.fullmatch(value):
            raise JobSpecError("command", f"command is blank: {help_}")
        command: tuple[str, ...] = ("sh", "-c", value)
        if "\0" in value:
            raise JobSpecError("command", "command must not contain NUL characters")
    elif isinstance(value, list | tuple):
        command = _strings(value, "command", MAX_COMMAND_ITEMS)
        if _BLANK_RE.fullmatch(command[0]):
            raise JobSpecError("command", f"the program (first item) is blank: {help_}")
    else:
        raise JobSpecError("command", f"{help_}, not {type_name(value)} {shown(value)}")
    room = MAX_COMMAND_ITEMS - len(command)
    args = () if raw.get("args") is None else _strings(raw["args"], "args", room)
    # each string is at least one byte per character: count characters first, so that a huge
    # command is refused without encoding it
    size = sum(len(s) + 1 for s in command + args)
    if size <= MAX_COMMAND_BYTES:
        size = sum(len(s.encode()) + 1 for s in command + args)
    if size > MAX_COMMAND_BYTES:
        raise JobSpecError(
            "args" if args and raw.get("args") is not None else "command",
            f"command: at most {size_text(MAX_COMMAND_BYTES)} with its args (got "
            f"{size} bytes); pass large inputs through a volume",
        )
    return command, args


def parse_command(value: object) -> list[str]:
    """A command as a job's ``command`` takes it (a list, or one line run with ``sh -c``),
    with the same caps: what an exec in a running job runs too. Raises JobSpecError."""
    return list(_command({"command": value})[0])


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
        out["\0too many"] = ""  # over any cap: _env's count check refuses it
    return out


def secret_reference(value: Mapping, key: str) -> str:
    """``{"secret": "wandb"}`` -> ``"wandb"`` (the name's syntax checked here; whether the
    owner has it, by the caller that knows)."""
    unknown = next((k for k in value if k != "secret"), None)
    if unknown is not None:
        raise JobSpecError(
            key,
            f'{key} must be a string or {{"secret": NAME}}; unknown field {shown(unknown)}',
        )
    return secret_name(key, value.get("secret"))


def _env(raw: Mapping) -> tuple[dict[str, str], dict[str, str]]:
    """(plain variables, variables filled from the owner's secrets: NAME -> secret name)."""
    value = env_entries(raw.get("env"))
    if value is None:
        return {}, {}
    if not isinstance(value, Mapping):
        raise JobSpecError(
            "env",
            'env must be an object of NAME: value strings (or NAME: {"secret": SECRET}), '
            f"not {shown(value)}",
        )
    check_count(JobSpecError, "env", len(value), MAX_ENV, "variables")
    env: dict[str, str] = {}
    secrets: dict[str, str] = {}
    total = 0
    for name, text in value.items():
        if not isinstance(name, str) or len(name) > MAX_ENV_NAME_CHARS:
            raise JobSpecError(
                "env", f"env: names are at most {MAX_ENV_NAME_CHARS} characters, not {shown(name)}"
            )
        key = f"env.{name}"
        if not ENV_NAME_RE.fullmatch(name):
            raise JobSpecError(
                key,
                f"environment variable name {shown(name)} must be letters, digits and '_', "
                "not starting with a digit",
            )
        if name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV_NAMES:
            raise JobSpecError(
                key,
                f"{name} is reserved to the platform: names starting with "
                f"{', '.join(RESERVED_ENV_PREFIXES)} and {', '.join(sorted(RESERVED_ENV_NAMES))}"
                " cannot be set",
            )
        if isinstance(text, Mapping):
            secrets[name] = secret_reference(text, key)
            total += len(name) + 1 + len(secrets[name])
            continue
        if not isinstance(text, str):
            raise JobSpecError(
                key,
                f'{key} must be a string or {{"secret": NAME}}, not {type_name(text)} '
                f"{shown(text)}",
            )
        size = len(text) if len(text) > MAX_ENV_VALUE_BYTES else len(text.encode())
        if size > MAX_ENV_VALUE_BYTES:
            raise JobSpecError(
                key,
                f"{key}: at most {size_text(MAX_ENV_VALUE_BYTES)} (got {size} bytes); "
                "pass large inputs through a volume",
            )
        if "\0" in text:
            raise JobSpecError(key, f"{key} must not contain NUL characters")
        total += len(name) + 1 + size
        if total > MAX_ENV_BYTES:
            raise JobSpecError(
                "env",
                f"env: at most {size_text(MAX_ENV_BYTES)} of names and values together; "
                "pass large inputs through a volume",
            )
        env[name] = text
    return env, secrets


def _labels(raw: Mapping) -> dict[str, str]:
    return checks.labels(JobSpecError, raw.get("labels"))


def _image(
    raw: Mapping, catalog: Catalog, allowed_images: frozenset[str], registries: tuple[str, ...]
) -> tuple[str, str | None, str | None]:
    custom = _optional_text(raw, "image", cap=MAX_IMAGE_CHARS)
    framework = _optional_text(raw, "framework")
    version = _optional_text(raw, "version")
    if custom is None or framework is not None or version is not None:
        fw, ver = checks.catalog_version(JobSpecError, catalog, framework, version)
        if custom is None or custom == ver.image:
            # the same image named both ways (a body returned by the API, resubmitted) is fine
            return ver.image, fw.id, ver.id
        raise JobSpecError(
            "image",
            f"give either image or framework (and version), not both: {fw.id} {ver.id} is "
            f"{ver.image!r}, not {custom!r}",
        )
    image = checks.image_choice(
        JobSpecError, custom, catalog, allowed_images, registries=registries
    )
    return image, None, None


def _resources(
    raw: Mapping,
    flavors: Mapping[str, Flavor],
    limits: Limits,
    default_flavor: str | None,
    host_gpus: int,
    gpu_home: str = "this host",
) -> tuple[str | None, Resources]:
    value = raw.get("resources")
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise JobSpecError(
            "resources", f"resources must be an object with {', '.join(RESOURCE_FIELDS)}"
        )
    unknown = first_unknown(value, _RESOURCE_FIELD_SET)
    if unknown is not None:
        raise JobSpecError(
            f"resources.{key_text(unknown)}",
            f"unknown resource {shown(unknown)}; resources take: {', '.join(RESOURCE_FIELDS)}",
        )
    given = {k: v if k == "cpus" else _whole(v) for k, v in value.items() if v is not None}
    cpus, memory, gpus = given.get("cpus"), given.get("memory"), given.get("gpus")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)):
        raise JobSpecError("resources.cpus", f"resources.cpus must be a number, not {shown(cpus)}")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | str)):
        raise JobSpecError(
            "resources.memory",
            f"resources.memory must be a size such as 512M or 4G, not {shown(memory)}",
        )
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int)):
        raise JobSpecError(
            "resources.gpus", f"resources.gpus must be a whole number, not {shown(gpus)}"
        )
    if isinstance(cpus, float) and not math.isfinite(cpus):
        raise JobSpecError("resources.cpus", f"resources.cpus must be finite, not {cpus!r}")

    flavor = _optional_text(raw, "flavor")
    if flavor is None and not given and default_flavor:
        flavor = default_flavor
    request: dict[str, Any] = dict(given)
    if flavor is None:
        request = {"cpus": DEFAULT_CPUS, "memory": DEFAULT_MEMORY, "gpus": DEFAULT_GPUS} | given

    def resolve(lim: Limits) -> Resources:
        # resolve_resources also holds every number to its sane range (gpulab.bounds): at
        # least 0.01 CPU (a smaller quota is no limit for the engine), 32M of memory...
        return checks.resources(JobSpecError, flavors, lim, flavor, request, prefix="resources.")

    # the request itself first (syntax, then what the host can hold), the user's limits after
    res = resolve(Limits(cpus=math.inf, memory=sys.maxsize, gpus=sys.maxsize))
    if res.gpus != int(res.gpus):
        # a flavor may give notebooks a share of a GPU (gpu_sharing); a job takes whole ones
        raise JobSpecError(
            "resources.gpus",
            f"flavor {flavor!r} gives {res.gpus:g} of a GPU, which only notebooks may share: "
            "a job takes whole GPUs; give resources.gpus (0, 1, ...) with that flavor",
        )
    too_many = beyond_gpus(res.gpus, host_gpus, gpu_home)
    if too_many:
        raise JobSpecError("resources.gpus", too_many)
    return flavor, resolve(limits)


def _volumes(raw: Mapping, storage: StorageConfig | None, user: str) -> tuple[VolumeSpec, ...]:
    value = raw.get("volumes")
    if value is None or value == []:
        return ()
    volumes = checks.volume_list(
        JobSpecError, value, storage, user, WORKSPACE_DIR, example="bucket@store/prefix:/data:ro"
    )
    return tuple(volumes)


def _hang_restart(raw: Mapping, max_timeout: float) -> HangRestart:
    value = raw.get("hang_restart")
    if value is None:
        return HangRestart()
    if not isinstance(value, Mapping):
        raise JobSpecError(
            "hang_restart",
            'hang_restart must be an object such as {"enabled": true, "period": "30m"}',
        )
    unknown = first_unknown(value, _HANG_RESTART_FIELD_SET)
    if unknown is not None:
        raise JobSpecError(
            f"hang_restart.{key_text(unknown)}",
            f"unknown field {shown(unknown)}; hang_restart takes: {', '.join(HANG_RESTART_FIELDS)}",
        )
    enabled = value.get("enabled")
    period = value.get("period")
    return HangRestart(
        enabled=False
        if enabled is None
        else checks.flag(JobSpecError, "hang_restart.enabled", enabled),
        period=DEFAULT_HANG_PERIOD
        if period is None
        else _duration(period, "hang_restart.period", MIN_HANG_PERIOD, max_timeout),
    )


def parse_working_dir(raw: Mapping) -> str | None:
    """An absolute, normalized path outside the system's trees (the same rule as a git
    checkout's path: :data:`~gpulab.jobs.spec.base.SYSTEM_DIRS`)."""

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
    return checks.flag(JobSpecError, "read_only_rootfs", value)


def parse_auto_delete(raw: Mapping, max_retention: float | None) -> float | None:
    """``auto_delete_after``: a duration from :data:`MIN_RETENTION` to the site's
    ``max_retention`` (None: :data:`MAX_RETENTION`); absent: None (the site's default)."""
    value = raw.get("auto_delete_after")
    if value is None or value == "":
        return None
    high = MAX_RETENTION if max_retention is None else min(max_retention, MAX_RETENTION)
    return _duration(value, "auto_delete_after", MIN_RETENTION, high)


def parse_fields(
    raw: Mapping,
    *,
    catalog: Catalog,
    flavors: Mapping[str, Flavor],
    limits: Limits,
    default_flavor: str | None,
    allowed_images: frozenset[str],
    storage: StorageConfig | None,
    user: str,
    host_gpus: int,
    max_timeout: float,
    gpu_home: str = "this host",
    image_registries: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every field of a submission, checked in the order of :data:`JOB_SPEC_FIELDS` (the first
    fault is reported), as keyword arguments of :class:`~gpulab.jobs.spec.JobSpec`."""
    if not isinstance(raw, Mapping):
        raise JobSpecError("", "a job submission must be a JSON object")
    unknown = first_unknown(raw, _JOB_SPEC_FIELD_SET)
    if unknown is not None:
        raise JobSpecError(
            key_text(unknown),
            f"unknown field {shown(unknown)}; a job takes: {', '.join(JOB_SPEC_FIELDS)}",
        )
    name = _name(raw)
    image, framework, version = _image(raw, catalog, allowed_images, image_registries)
    command, args = _command(raw)
    env, secret_env = _env(raw)
    labels = _labels(raw)
    flavor, resources = _resources(raw, flavors, limits, default_flavor, host_gpus, gpu_home)
    gpu_model, node_pool = checks.want(
        JobSpecError, raw.get("gpu_model"), raw.get("node_pool"), flavors.get(flavor or "")
    )
    workers = (
        1 if raw.get("workers") is None else _integer(raw["workers"], "workers", 1, MAX_WORKERS)
    )
    volumes = _volumes(raw, storage, user)
    timeout = (
        min(DEFAULT_TIMEOUT, max_timeout)
        if raw.get("timeout") is None
        else _duration(raw["timeout"], "timeout", 0.0, max_timeout)
    )
    retries = (
        0 if raw.get("retries") is None else _integer(raw["retries"], "retries", 0, MAX_RETRIES)
    )
    hang_restart = _hang_restart(raw, max_timeout)
    preemptible = (
        False
        if raw.get("preemptible") is None
        else checks.flag(JobSpecError, "preemptible", raw["preemptible"])
    )
    terminate = (
        False
        if raw.get("terminate_after_preemption") is None
        else checks.flag(
            JobSpecError, "terminate_after_preemption", raw["terminate_after_preemption"]
        )
    )
    priority = (
        DEFAULT_PRIORITY
        if raw.get("priority") is None
        else _integer(raw["priority"], "priority", 0, MAX_PRIORITY)
    )
    return dict(
        name=name,
        framework=framework,
        version=version,
        image=image,
        command=command,
        args=args,
        env=env,
        labels=labels,
        flavor=flavor,
        resources=resources,
        gpu_model=gpu_model,
        node_pool=node_pool,
        workers=workers,
        volumes=volumes,
        timeout=timeout,
        retries=retries,
        hang_restart=hang_restart,
        preemptible=preemptible,
        terminate_after_preemption=terminate,
        priority=priority,
        secret_env=secret_env,
    )
