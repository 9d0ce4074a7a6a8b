"""The JSON Schema (draft 2020-12) of a job submission, for the service's OpenAPI document.

It says what :func:`gpulab.jobs.spec.parse_job_spec` accepts, caps included; a unit test keeps
the two in step (fields, and examples both must accept or refuse).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ... import imagerefs
from ...bounds import (
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ITEMS,
    MAX_CPUS,
    MAX_ENV,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_BYTES,
    MAX_GIT_REF_CHARS,
    MAX_GIT_SOURCES,
    MAX_GIT_URL_CHARS,
    MAX_GPUS,
    MAX_ID_CHARS,
    MAX_IMAGE_CHARS,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_MEMORY,
    MAX_NAME_CHARS,
    MAX_NUMBER_CHARS,
    MAX_VOLUME_SPEC_CHARS,
    MAX_VOLUMES,
    MIN_CPUS,
    MIN_MEMORY,
    size_text,
)
from ...checks import MAX_SECRET_NAME_CHARS, SECRET_NAME_PATTERN
from ...frameworks import Catalog
from ...live_push import DEFAULT_FLOOR_S, MAX_INTERVAL_S
from ...notices import (
    EMAIL_PATTERN,
    EVENTS,
    MAX_EMAIL_CHARS,
    MAX_URL_CHARS,
    NotifyRules,
)
from ...notices import URL_PATTERN as WEBHOOK_PATTERN
from ...resources import (
    MODEL_PATTERN,
    POOL_PATTERN,
    Flavor,
    Limits,
    Resources,
    format_memory,
    parse_memory,
)
from ...volumes import volume_pattern
from ..gang import DISTRIBUTED_ENV
from .array import (
    MAX_COMPLETIONS,
    MAX_PARAMETER_KEY_CHARS,
    MAX_PARAMETER_KEYS,
    MAX_PARAMETER_SET_BYTES,
    MAX_PARAMETER_VALUE_CHARS,
    MAX_PARAMETERS_BYTES,
    PARAMETER_KEY_RE,
)
from .base import (
    ABSENT_TEXT,
    BLANK_CLASS,
    DEFAULT_CPUS,
    DEFAULT_GPUS,
    DEFAULT_HANG_PERIOD,
    DEFAULT_MEMORY,
    DEFAULT_PRIORITY,
    DURATION_PATTERN,
    ENV_NAME_RE,
    LABEL_KEY_RE,
    MAX_PATH_CHARS,
    MAX_PRIORITY,
    MAX_RETENTION,
    MAX_RETRIES,
    MAX_WORKERS,
    MEMORY_PATTERN,
    MIN_HANG_PERIOD,
    MIN_RETENTION,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESERVED_LABEL_PREFIXES,
    WORKSPACE_DIR,
)
from .git import NAMED_URL_PATTERN, REF_PATTERN, URL_PATTERN
from .git import PATH_PATTERN as GIT_PATH_PATTERN
from .ports import MAX_PORTS, MAX_PRINCIPAL_CHARS, MAX_SHARE_NAMES, PORT_NAME_RE

__all__ = ["DURATION_FORMAT", "JOB_SPEC_SCHEMA", "SIZE_FORMAT", "job_spec_schema"]

#: custom string formats (JSON Schema ``format``): what a pattern cannot say, the value range
DURATION_FORMAT = "gpulab-duration"
SIZE_FORMAT = "gpulab-size"
#: a string without NUL characters, and one that also has a character other than white space
_NO_NUL = r"^[^\x00]*$"
_NOT_BLANK = rf"^[^\x00]*[^\x00{BLANK_CLASS}][^\x00]*$"
#: ``sh``, ``-c`` and the string's NUL: what running a string command adds to its bytes
_SHELL_BYTES = len("sh\0-c\0") + 1

#: JSON Schema of one ``{"secret": NAME}`` reference (an env value)
SECRET_REF_SCHEMA: dict = {
    "type": "object",
    "required": ["secret"],
    "additionalProperties": False,
    "properties": {
        "secret": {
            "type": "string",
            "pattern": SECRET_NAME_PATTERN,
            "maxLength": MAX_SECRET_NAME_CHARS,
        }
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


#: an environment variable's name (a JSON Schema for a string, without its type: the
#: object form's propertyNames take it as it is)
_ENV_NAME: dict = {
    "pattern": ENV_NAME_RE.pattern,
    "maxLength": MAX_ENV_NAME_CHARS,
    "not": {
        "anyOf": [{"pattern": f"^{p}"} for p in RESERVED_ENV_PREFIXES]
        + [{"const": n} for n in sorted(RESERVED_ENV_NAMES)]
    },
}
_ENV_TEXT: dict = {"type": "string", "maxLength": MAX_ENV_VALUE_BYTES, "pattern": _NO_NUL}
_ENV_VALUE: dict = {"oneOf": [_ENV_TEXT, SECRET_REF_SCHEMA]}
#: a distributed job's variables are gpulab's (jobs.gang.DISTRIBUTED_ENV): a job of more than
#: one worker may not set them, in either form of ``env``
WORKERS_ENV_SCHEMA: dict = {
    "anyOf": [
        {
            "not": {
                "required": ["workers"],
                "properties": {"workers": {"type": "number", "minimum": 2}},
            }
        },
        {
            "properties": {
                "env": {
                    "propertyNames": {"not": {"enum": list(DISTRIBUTED_ENV)}},
                    "items": {"properties": {"name": {"not": {"enum": list(DISTRIBUTED_ENV)}}}},
                }
            }
        },
    ]
}

_OPTIONAL_TEXT = ["string", "null"]

#: JSON Schema (draft 2020-12) of the ``git`` field, for the OpenAPI document
GIT_SCHEMA: dict[str, Any] = {
    "type": ["array", "null"],
    "maxItems": MAX_GIT_SOURCES,
    "items": {
        "type": "object",
        "required": ["url"],
        "additionalProperties": False,
        "anyOf": [
            {"required": ["path"], "properties": {"path": {"type": "string", "minLength": 1}}},
            {"properties": {"url": {"pattern": NAMED_URL_PATTERN}}},
        ],
        "not": {
            "required": ["branch", "revision"],
            "properties": {
                "branch": {"type": "string", "minLength": 1},
                "revision": {"type": "string", "minLength": 1},
            },
        },
        "properties": {
            "url": {
                "type": "string",
                "maxLength": MAX_GIT_URL_CHARS,
                "pattern": URL_PATTERN,
                "description": "The repository's https:// (or http://) URL, without a user "
                "name or password (give `secret` instead).",
                "examples": ["https://github.com/org/repo.git"],
            },
            "branch": {
                "type": _OPTIONAL_TEXT,
                "maxLength": MAX_GIT_REF_CHARS,
                "pattern": f"^$|{REF_PATTERN}",
                "description": "The branch to check out (default: the remote's default branch).",
            },
            "revision": {
                "type": _OPTIONAL_TEXT,
                "maxLength": MAX_GIT_REF_CHARS,
                "pattern": f"^$|{REF_PATTERN}",
                "description": "A tag, a commit (full or abbreviated hash) or a full ref name "
                "(refs/...) to check out, detached; exclusive with `branch`.",
            },
            "path": {
                "type": _OPTIONAL_TEXT,
                "maxLength": MAX_PATH_CHARS,
                "pattern": f"^$|{GIT_PATH_PATTERN}",
                "description": "Where the job sees the clone (absolute; default "
                "/workspace/<repository name>, which needs a URL whose last part is a plain "
                "directory name). Not a system directory; one per repository: no two the same "
                "or one inside another, nor a volume's mount path.",
            },
            "secret": {
                "type": _OPTIONAL_TEXT,
                "maxLength": MAX_SECRET_NAME_CHARS,
                "pattern": f"^$|{SECRET_NAME_PATTERN}",
                "description": "The name of one of your secrets holding the HTTP credential: "
                "`user:password`, or a token (sent as user x-access-token, the GitHub and "
                "GitLab convention).",
            },
        },
    },
    "description": "Git repositories cloned before the job starts, each into a volume of its "
    "own mounted read-write at its path. Clones are inputs: they are not pushed to any store.",
}


#: JSON Schema of the ``notify`` field (gpulab.notices); a deployment's says where it may go
NOTIFY_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "on": {
            "type": ["array", "null"],
            "items": {"enum": list(EVENTS)},
            "minItems": 1,
            "maxItems": 2 * len(EVENTS),
            "default": list(EVENTS),
            "description": "The events to be told of: done (ended DONE), failed (FAILED, ERROR "
            "or SYNC_FAILED), interrupted (INTERRUPTED: by its owner, an admin or its "
            "time-out), preempted (its GPUs taken back: SIGTERM, then the grace period to "
            "checkpoint). Default: all.",
        },
        "webhook": {
            "type": ["string", "null"],
            "maxLength": MAX_URL_CHARS,
            "pattern": WEBHOOK_PATTERN,
            "description": "An https:// (or http://) URL that gets a JSON POST per event (the "
            "job's id, name, owner, state, reason, message, exit code and times), only to the "
            "hosts the admin allows and never to a private address; no user:password@ in it.",
        },
        "email": {
            "type": ["string", "null"],
            "maxLength": MAX_EMAIL_CHARS,
            "pattern": EMAIL_PATTERN,
            "description": "An e-mail address in a domain the admin allows, mailed through the "
            "site's SMTP server.",
        },
    },
    "anyOf": [
        {"required": ["webhook"], "properties": {"webhook": {"type": "string", "minLength": 1}}},
        {"required": ["email"], "properties": {"email": {"type": "string", "minLength": 1}}},
        {"type": "null"},
    ],
    "description": "Tell the job's owner when it ends, fails or is preempted, by webhook "
    "and/or e-mail. Sent in the background, retried a few times; a notice that cannot be "
    "delivered never holds the job up.",
}


_DURATION_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "number", "exclusiveMinimum": 0, "description": "seconds"},
        {
            "type": "string",
            "format": DURATION_FORMAT,
            "minLength": 1,
            "maxLength": MAX_NUMBER_CHARS,
            "pattern": DURATION_PATTERN,
            "examples": ["90s", "30m", "1h30m", "7d"],
        },
        {"type": "null"},
    ]
}

JOB_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Job submission",
    "description": "A training job: a container run to completion. Only `command` is required.",
    "type": "object",
    "additionalProperties": False,
    "required": ["command"],
    "allOf": [WORKERS_ENV_SCHEMA],
    "properties": {
        "name": {
            "type": ["string", "null"],
            "pattern": r"^([a-z][a-z0-9-]*)?$",
            "maxLength": MAX_NAME_CHARS,
            "description": "Lowercase letters, digits and '-', starting with a letter; "
            "generated when absent.",
        },
        "framework": {
            "type": ["string", "null"],
            "maxLength": MAX_ID_CHARS,
            "description": "Framework id from the catalog (default: the catalog's default).",
        },
        "version": {
            "type": ["string", "null"],
            "maxLength": MAX_ID_CHARS,
            "description": "Version id of the framework (default: its first version).",
        },
        "image": {
            "type": ["string", "null"],
            "maxLength": MAX_IMAGE_CHARS,
            "description": "A catalog image or one of the admin's allowed images. Give it or "
            "`framework`/`version`, not both (unless they name this very image, as in a body "
            "returned by the API).",
        },
        "image_pull_policy": {
            "type": ["string", "null"],
            "enum": [*imagerefs.PULL_POLICIES, *ABSENT_TEXT],
            "description": "For an image from a registry (one the admin's `image_registries` "
            "allow): `always` pulls at every start (layers already on the node are not fetched "
            "again), `if-not-present` only when the node lacks the image's digest, `never` "
            "uses the node's copy. Whatever the policy, the registry is asked for the image's "
            "digest with your credentials at every start. Default: the site's.",
        },
        "image_pull_secret": {
            "type": ["string", "null"],
            "maxLength": MAX_SECRET_NAME_CHARS,
            "description": "For a private image from a registry: the name of your secret "
            "(`gpulab secret set NAME`) that holds USERNAME:PASSWORD (or a token as the "
            'password), or {"username": ..., "password": ...}.',
        },
        "command": {
            "oneOf": [
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_COMMAND_BYTES - _SHELL_BYTES,
                    "pattern": _NOT_BLANK,
                    "description": "run with sh -c",
                },
                {
                    "type": "array",
                    "prefixItems": [{"type": "string", "pattern": _NOT_BLANK}],
                    "items": {"type": "string", "pattern": _NO_NUL},
                    "minItems": 1,
                    "maxItems": MAX_COMMAND_ITEMS,
                },
            ],
            "description": "The program and its arguments, or one shell command line. With "
            f"`args`: at most {MAX_COMMAND_ITEMS} entries and {size_text(MAX_COMMAND_BYTES)} "
            "in UTF-8 together; no NUL characters, and not blank (the program, for a list).",
        },
        "args": {
            "type": ["array", "null"],
            "items": {"type": "string", "pattern": _NO_NUL},
            "maxItems": MAX_COMMAND_ITEMS,
        },
        "env": {
            "oneOf": [
                {
                    "type": "object",
                    "maxProperties": MAX_ENV,
                    "propertyNames": _ENV_NAME,
                    "additionalProperties": _ENV_VALUE,
                },
                {
                    "type": "array",
                    "maxItems": MAX_ENV,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", **_ENV_NAME},
                            "value": _ENV_VALUE,
                            "secret": SECRET_REF_SCHEMA["properties"]["secret"],
                        },
                        "oneOf": [{"required": ["value"]}, {"required": ["secret"]}],
                    },
                    "description": 'The same as a list: [{"name": NAME, "value": TEXT} or '
                    '{"name": NAME, "secret": SECRET}], each name once (Kubernetes\' shape).',
                },
                {"type": "null"},
            ],
            "description": f"Environment variables (values at most "
            f"{size_text(MAX_ENV_VALUE_BYTES)} in UTF-8, names and values at most "
            f"{size_text(MAX_ENV_BYTES)} together); names starting with "
            f"{', '.join(RESERVED_ENV_PREFIXES)} are reserved, and a distributed job's "
            f"({', '.join(DISTRIBUTED_ENV[:3])}...) are set by gpulab when `workers` is over "
            "1. Plain values are shown back by the API: put credentials in a secret and refer "
            'to it as {"secret": NAME} (the container gets the value; the API shows only the '
            "reference).",
        },
        "labels": {
            "type": ["object", "null"],
            "maxProperties": MAX_LABELS,
            "propertyNames": {
                "pattern": LABEL_KEY_RE.pattern,
                "maxLength": MAX_LABEL_KEY_CHARS,
                "not": {
                    "anyOf": [{"pattern": "^" + re.escape(p)} for p in RESERVED_LABEL_PREFIXES]
                },
            },
            "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE_CHARS},
        },
        "flavor": {
            "type": ["string", "null"],
            "maxLength": MAX_ID_CHARS,
            "description": "A resource flavor; `resources` fields override its values.",
        },
        "resources": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "cpus": {
                    "type": ["number", "null"],
                    "minimum": MIN_CPUS,
                    "maximum": MAX_CPUS,
                    "default": DEFAULT_CPUS,
                },
                "memory": {
                    "oneOf": [
                        {
                            "type": "string",
                            "format": SIZE_FORMAT,
                            "maxLength": MAX_NUMBER_CHARS,
                            "pattern": MEMORY_PATTERN,
                            "examples": ["512M", "4G", "1.5GiB"],
                        },
                        {
                            "type": "integer",
                            "minimum": MIN_MEMORY,
                            "maximum": MAX_MEMORY,
                            "description": "bytes",
                        },
                        {"type": "null"},
                    ],
                    "default": DEFAULT_MEMORY,
                    "description": f"At least {format_memory(MIN_MEMORY)}.",
                },
                "gpus": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_GPUS,
                    "default": DEFAULT_GPUS,
                },
            },
        },
        "gpu_model": {
            "type": ["string", "null"],
            "maxLength": 64,
            "pattern": f"^$|{MODEL_PATTERN}",  # "" is absent, as null
            "description": "The model of the GPUs to run on (every worker's), one of the "
            "platform's (this document's enum lists them); compared with case, spaces, '-' and "
            "'_' folded. A flavor that names a model runs on it: another one is refused. Refused "
            "(400) when no node has that many GPUs of it; waits while they are busy.",
        },
        "node_pool": {
            "type": ["string", "null"],
            "maxLength": 64,
            "pattern": f"^$|{POOL_PATTERN}",
            "description": "The node pool to run in (every worker), one of the platform's "
            "(this document's enum lists them); compared without case. "
            "A flavor that names a pool runs in it. Refused (400) when no node is in it.",
        },
        "volumes": {
            "type": ["array", "null"],
            "maxItems": MAX_VOLUMES,
            "items": {
                "type": "string",
                "maxLength": MAX_VOLUME_SPEC_CHARS,
                "pattern": volume_pattern(WORKSPACE_DIR),
                "examples": ["datasets@s3/mnist:/data:ro"],
            },
            "description": "container@store[/prefix]:/mount/path[:ro|rw|rwd]: a bucket (S3's "
            "naming rules) on one of the platform's object stores, an optional key prefix "
            "(no empty, '.' or '..' parts), an absolute mount path (not in or above a system "
            f"directory, nor {WORKSPACE_DIR}) and the sync mode (default ro). No control "
            "characters. Two volumes may not share a mount path or lie one inside the other.",
        },
        "workers": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_WORKERS,
            "default": 1,
            "description": "Containers of a distributed job, each with `resources`, placed "
            "all together or not at all; each is told MASTER_ADDR, MASTER_PORT, WORLD_SIZE, "
            "RANK, LOCAL_RANK and NODE_RANK (torch.distributed's env:// and torchrun).",
        },
        "completions": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_COMPLETIONS,
            "description": "A job array (a sweep): run this many tasks, each a job of its own "
            "(scheduled, retried and billed alone) told GPULAB_ARRAY_ID, GPULAB_TASK_INDEX (0 "
            "to completions-1), GPULAB_TASK_COUNT and GPULAB_TASK_PARAMS. With parameters: "
            "their number (another value is refused). Shown as one job with its tasks.",
        },
        "parallelism": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_COMPLETIONS,
            "description": "Most tasks of the array running at once (at most completions; "
            "default: completions, as GPUs and the quota allow). Needs completions or "
            "parameters.",
        },
        "parameters": {
            "type": ["array", "null"],
            "minItems": 1,
            "maxItems": MAX_COMPLETIONS,
            "items": {
                "type": "object",
                "maxProperties": MAX_PARAMETER_KEYS,
                "propertyNames": {
                    "pattern": PARAMETER_KEY_RE.pattern,
                    "maxLength": MAX_PARAMETER_KEY_CHARS,
                },
                "additionalProperties": {
                    "anyOf": [
                        {
                            "type": "string",
                            "maxLength": MAX_PARAMETER_VALUE_CHARS,
                            "pattern": _NO_NUL,
                        },
                        {"type": "number"},
                    ]
                },
            },
            "description": "A job array with one task per parameter set: task i is told its "
            "set as GPULAB_TASK_PARAMS (JSON) and one GPULAB_PARAM_<KEY> per key (upper-cased; "
            "two keys that differ only in case are refused). At most "
            f"{size_text(MAX_PARAMETER_SET_BYTES)} a set and {size_text(MAX_PARAMETERS_BYTES)} "
            "in all, as JSON.",
            "examples": [[{"lr": 0.01, "model": "resnet18"}, {"lr": 0.001, "model": "resnet50"}]],
        },
        "timeout": {
            **_DURATION_SCHEMA,
            "description": "Most the job may run (default 7 days).",
        },
        "retries": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": MAX_RETRIES,
            "default": 0,
            "description": "Restarts after a failure.",
        },
        "hang_restart": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": ["boolean", "null"], "default": False},
                "period": {
                    **_DURATION_SCHEMA,
                    "default": DEFAULT_HANG_PERIOD,
                    "description": "Seconds without progress before a restart (at least 10).",
                },
            },
        },
        "preemptible": {
            "type": ["boolean", "null"],
            "default": False,
            "description": "May run on idle GPUs beyond the owner's quota, and be preempted.",
        },
        "terminate_after_preemption": {
            "type": ["boolean", "null"],
            "default": False,
            "description": "When preempted, end INTERRUPTED (reason PREEMPTED) after the grace "
            "period instead of going back to the queue.",
        },
        "priority": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": MAX_PRIORITY,
            "default": DEFAULT_PRIORITY,
        },
        "ports": PORTS_SCHEMA,
        "git": GIT_SCHEMA,
        "working_dir": {
            "type": ["string", "null"],
            "maxLength": MAX_PATH_CHARS,
            "pattern": f"^$|{GIT_PATH_PATTERN}",
            "description": "The command's working directory (absolute; default: the image's, "
            "/workspace for gpulab's images).",
        },
        "read_only_rootfs": {
            "type": ["boolean", "null"],
            "default": False,
            "description": "Mount the image's file system read-only: only /workspace, the "
            "volumes, git checkouts and a small /tmp are writable.",
        },
        "notify": NOTIFY_SCHEMA,
        "auto_delete_after": {
            **_DURATION_SCHEMA,
            "description": "How long after its end the job's record, history and saved logs "
            "are kept before the service deletes them (at least 1 minute; default: the site's "
            "job_retention, which may be forever). What was billed stays billed.",
        },
        "sync_interval": {
            **_DURATION_SCHEMA,
            "description": "Seconds between live pushes of the job's rw/rwd volumes while it "
            "runs: files unchanged for 10 s and while read are pushed, nothing is deleted "
            "until the final push at its end; a killed container or a lost node then loses "
            "at most one interval of work. 0: pushed at the end only; default: the flavor's, "
            "else the site's sync_interval. 0 or at least the site's floor (60 s by default), "
            "at most a day.",
        },
    },
}


# --- the schema of one deployment, for one caller ---------------------------------------------

_NOTHING = ABSENT_TEXT


def _duration_schema(low: float, exclusive: bool, high: float, what: str) -> dict[str, Any]:
    """A duration field of a deployment: seconds as a number, or a string whose range the
    format says (a pattern cannot bound a sum of parts)."""
    low_text = f"more than {low:g}" if exclusive else f"at least {low:g}"
    return {
        "oneOf": [
            {
                "type": "number",
                ("exclusiveMinimum" if exclusive else "minimum"): low,
                "maximum": high,
                "description": "seconds",
            },
            {
                "type": "string",
                "format": DURATION_FORMAT,
                "description": f"{DURATION_FORMAT}: a number of seconds or d/h/m/s parts, "
                f"largest first ({', '.join(['90s', '30m', '1h30m', '7d'])}); "
                f"{low_text} and at most {high:g} seconds",
            },
            {"type": "null"},
        ],
        "description": what,
    }


def _memory_schema(high: int) -> dict[str, Any]:
    return {
        "oneOf": [
            {"type": "integer", "minimum": MIN_MEMORY, "maximum": high, "description": "bytes"},
            {
                "type": "string",
                "format": SIZE_FORMAT,
                "description": f"{SIZE_FORMAT}: a size such as 512M, 4G or 1.5GiB, from "
                f"{format_memory(MIN_MEMORY)} to {format_memory(high)}",
            },
            {"type": "null"},
        ]
    }


def _fits(value: float, low: float, high: float) -> bool:
    return low <= value <= high


def _gang_branches(
    flavors: Mapping[str, Flavor],
    gpus_any: int,
    quota_gpus: int | None,
    quota_jobs: int | None,
    slots: Mapping[int, int],
) -> list[dict[str, Any]]:
    """How many workers a distributed job may have, by its GPUs per worker ``g`` (given in
    ``resources.gpus``, else its flavor's, else the default): at most ``slots[g]`` (workers
    of ``g`` GPUs the nodes hold at once) and, unless preemptible, ``quota_gpus // g``."""
    one = {"properties": {"workers": {"enum": [1, None]}}}
    out: list[dict[str, Any]] = [one]
    for g in range(gpus_any + 1):
        ways = [
            {
                "properties": {
                    "resources": {
                        "type": "object",
                        "properties": {"gpus": {"const": g}},
                        "required": ["gpus"],
                    }
                },
                "required": ["resources"],
            }
        ]
        absent = {
            "anyOf": [
                {"not": {"required": ["resources"]}},
                {
                    "properties": {
                        "resources": {
                            "anyOf": [
                                {"type": "null"},
                                {"properties": {"gpus": {"type": "null"}}},
                                {"not": {"required": ["gpus"]}},
                            ]
                        }
                    }
                },
            ]
        }
        named = [f.id for f in flavors.values() if f.resources.gpus == g]
        if named:
            ways.append(
                {
                    "allOf": [
                        absent,
                        {"properties": {"flavor": {"enum": named}}, "required": ["flavor"]},
                    ]
                }
            )
        if g == DEFAULT_GPUS:
            ways.append({"allOf": [absent, {"properties": {"flavor": {"enum": ABSENT_TEXT}}}]})
        most = MAX_WORKERS if g == 0 else min(MAX_WORKERS, slots.get(g, 0))
        in_quota = most if g == 0 or quota_gpus is None else min(most, quota_gpus // g)
        if quota_jobs == 0:  # nothing runs in quota: only preemptible jobs are accepted
            in_quota = 0
        kinds = [({"enum": [False, None]}, in_quota), ({"const": True}, most)]
        if in_quota == most:
            kinds = [(None, most)]
        for preemptible, high in kinds:
            if high < 2:
                continue
            branch: dict[str, Any] = {
                "properties": {"workers": {"type": "integer", "minimum": 2, "maximum": high}},
                "required": ["workers"],
                "anyOf": ways,
            }
            if preemptible is not None:
                branch["properties"]["preemptible"] = preemptible
                if preemptible.get("const") is True:
                    branch["required"].append("preemptible")
            out.append(branch)
    return out


def job_spec_schema(
    *,
    catalog: Catalog,
    flavors: Mapping[str, Flavor],
    limits: Limits,
    allowed_images: Iterable[str],
    host_gpus: int,
    quota_gpus: int | None,
    quota_jobs: int | None,
    max_timeout: float,
    max_priority: int = MAX_PRIORITY,
    volumes: bool | str | None = True,
    secret_names: Iterable[str] | None = (),
    git: bool = True,
    gang_slots: Mapping[int, int] | None = None,
    max_workers: int = MAX_WORKERS,
    max_tasks: int = MAX_COMPLETIONS,
    notify_rules: NotifyRules | None = None,
    max_retention: float | None = None,
    gpu_models: Iterable[str] = (),
    node_pools: Iterable[str] = (),
    image_registries: Iterable[str] = (),
    sync_floor: float = DEFAULT_FLOOR_S,
) -> dict[str, Any]:
    """:data:`JOB_SPEC_SCHEMA` narrowed to what this deployment accepts from one caller: the
    catalog's frameworks, versions and images (and the admin's allowed images), the flavors,
    the caller's resource limits and GPU quota, the host's GPUs, the longest time-out, the
    highest priority the caller may ask for, no volumes where no object store is set, and
    no webhook or e-mail notices where the admin allows none (``notify_rules``).
    ``volumes``: True (any store, the syntax alone), False or None (none: no store, or no
    grant for the caller), or the pattern of what the caller may mount
    (:meth:`gpulab.storage.StorageConfig.volume_pattern`).

    Combinations the parser refuses are ruled out too (``anyOf``): a version of another
    framework, an image that contradicts its framework, a flavor whose values exceed the
    limits unless ``resources`` override them, more GPUs than the quota unless preemptible.
    What stays out of reach of a schema: the sums (command and args together, all of env,
    UTF-8 bytes where a cap counts them), and what one list entry is to another (volumes'
    mount paths, repositories' paths, ports' names and numbers, env entries' names), and
    where a notice may go (a webhook's host and address, an e-mail's domain: the admin's
    patterns are in the descriptions), how many GPUs of a model (``gpu_models``, the names
    offered) or in a pool (``node_pools``) a node has, and a model other than the one a
    flavor names, each refused with a 400 naming the field.
    """
    schema = copy.deepcopy(JOB_SPEC_SCHEMA)
    schema.pop("$schema", None)  # embedded in an OpenAPI 3.1 document, whose dialect it is
    props = schema["properties"]

    # frameworks, versions, images: each version with the ways to name it
    default_fw = catalog.framework(None)
    frameworks = list(catalog.frameworks.values())
    custom = sorted(set(allowed_images) | catalog.images())
    props["framework"]["enum"] = [f.id for f in frameworks] + _NOTHING
    props["version"]["enum"] = sorted({v.id for f in frameworks for v in f.versions}) + _NOTHING
    props["image"]["enum"] = custom + _NOTHING
    # (an absent field is the default: a branch whose field has no default requires it)
    named: list[dict[str, Any]] = []
    for fw in frameworks:
        for i, ver in enumerate(fw.versions):
            named.append(
                {
                    "properties": {
                        "framework": {"enum": [fw.id] + (_NOTHING if fw is default_fw else [])},
                        "version": {"enum": [ver.id] + (_NOTHING if i == 0 else [])},
                        "image": {"enum": [ver.image, *_NOTHING]},
                    },
                    "required": (["framework"] if fw is not default_fw else [])
                    + (["version"] if i else []),
                }
            )
    named.append(
        {
            "properties": {
                "framework": {"enum": _NOTHING},
                "version": {"enum": _NOTHING},
                "image": {"enum": custom},
            },
            "required": ["image"],
        }
    )
    # images from registries: pulled, with the caller's own secret for a private one; the
    # admin's patterns are said in the description (a pattern cannot hold them all)
    caller_secrets = sorted(secret_names or ())
    registries = list(image_registries)
    for branch in named:
        branch["properties"]["image_pull_policy"] = {"enum": _NOTHING}
        branch["properties"]["image_pull_secret"] = {"enum": _NOTHING}
    if registries:
        props["image"].pop("enum")
        props["image"]["description"] += (
            " Or an image from a registry and repository the admin allows: "
            + ", ".join(registries)
            + " (* stops at a /, ** does not; Docker Hub's official images are "
            "docker.io/library/NAME)."
        )
        props["image_pull_secret"]["enum"] = [*caller_secrets, *_NOTHING]
        named.append(
            {
                "properties": {
                    "framework": {"enum": _NOTHING},
                    "version": {"enum": _NOTHING},
                    "image": {
                        "type": "string",
                        "pattern": imagerefs.REF_PATTERN,
                        # the engine's own images: never pulled
                        **({"not": {"enum": custom}} if custom else {}),
                    },
                },
                "required": ["image"],
            }
        )
    else:
        props["image_pull_policy"]["enum"] = _NOTHING
        props["image_pull_secret"]["enum"] = _NOTHING

    # resources: a flavor (or the job defaults) whose values the overrides replace, each held
    # to the caller's limits; GPUs also to the host's and, unless preemptible, to the quota
    cpus_max = min(MAX_CPUS, limits.cpus)
    memory_max = min(MAX_MEMORY, limits.memory)
    gpus_any = min(MAX_GPUS, host_gpus, limits.gpus)
    gpus_in = gpus_any if quota_gpus is None else min(gpus_any, quota_gpus)
    kinds: list[tuple[dict[str, Any] | None, int]] = []
    if gpus_in == gpus_any and quota_jobs != 0:
        kinds.append((None, gpus_any))
    else:
        kinds.append(({"const": True}, gpus_any))
        if quota_jobs != 0 and gpus_in >= 0:
            kinds.append(({"enum": [False, None]}, gpus_in))
    defaults = Resources(DEFAULT_CPUS, parse_memory(DEFAULT_MEMORY), DEFAULT_GPUS)
    choices: list[tuple[list, Resources]] = [(_NOTHING, defaults)]
    choices += [([f.id], f.resources) for f in flavors.values()]
    fitting: list[str] = []
    sized: list[dict[str, Any]] = []
    for preemptible, gpus_max in kinds:
        for names, base in choices:
            ranges = {
                "cpus": (MIN_CPUS, cpus_max, base.cpus),
                "memory": (MIN_MEMORY, memory_max, base.memory),
                "gpus": (0, gpus_max, base.gpus),
            }
            if any(low > high for low, high, _ in ranges.values()):
                continue
            values = {
                "cpus": {"type": "number", "minimum": MIN_CPUS, "maximum": cpus_max},
                "memory": _memory_schema(memory_max),
                "gpus": {"type": "integer", "minimum": 0, "maximum": gpus_max},
            }
            # a flavor's share of a GPU (notebooks only) does not stand for a job: gpus given
            given = [
                d
                for d, (low, high, v) in ranges.items()
                if not _fits(v, low, high) or (d == "gpus" and v != int(v))
            ]
            res: dict[str, Any] = {
                "type": "object" if given else ["object", "null"],
                "properties": {
                    d: s if d in given else {"anyOf": [s, {"type": "null"}]}
                    for d, s in values.items()
                },
            }
            if given:
                res["required"] = given
            branch: dict[str, Any] = {
                "properties": {"flavor": {"enum": names}, "resources": res},
                "required": (["flavor"] if names != _NOTHING else [])
                + (["resources"] if given else []),
            }
            if preemptible is not None:
                branch["properties"]["preemptible"] = preemptible
                if preemptible.get("const") is True:
                    branch["required"].append("preemptible")
            sized.append(branch)
            fitting += [n for n in names if n]
    props["flavor"]["enum"] = sorted(set(fitting)) + _NOTHING
    resources = props["resources"]["properties"]
    resources["memory"] = {**_memory_schema(memory_max), "default": DEFAULT_MEMORY}
    resources["cpus"]["maximum"] = cpus_max
    resources["gpus"]["maximum"] = gpus_any

    props["timeout"] = _duration_schema(0, True, max_timeout, props["timeout"]["description"])
    period = props["hang_restart"]["properties"]["period"]
    props["hang_restart"]["properties"]["period"] = {
        **_duration_schema(MIN_HANG_PERIOD, False, max_timeout, period["description"]),
        "default": DEFAULT_HANG_PERIOD,
    }
    props["priority"]["maximum"] = max_priority
    for key, names in (("gpu_model", gpu_models), ("node_pool", node_pools)):
        props[key]["enum"] = [*dict.fromkeys(names), *_NOTHING]
    props["auto_delete_after"] = _duration_schema(
        MIN_RETENTION,
        False,
        MAX_RETENTION if max_retention is None else min(max_retention, MAX_RETENTION),
        props["auto_delete_after"]["description"],
    )
    interval = _duration_schema(sync_floor, False, MAX_INTERVAL_S, "")
    props["sync_interval"] = {
        "oneOf": [{"const": 0, "description": "no live push"}, *interval["oneOf"]],
        "description": props["sync_interval"]["description"],
    }
    if not volumes:
        props["volumes"] = {
            "type": ["array", "null"],
            "maxItems": 0,
            "description": "No object store is configured on this platform: no data volumes."
            if volumes is False
            else "No bucket is granted to you (and you have no workspace): no data volumes.",
        }
    elif volumes is not True:  # the caller's grants, as one pattern (volumes.access_pattern)
        item = props["volumes"]["items"]
        item["pattern"] = volumes
        item.pop("examples")
        props["volumes"]["description"] += (
            " Only the buckets and prefixes granted to you (and your own workspace), in the "
            "modes granted."
        )
    # secrets: only the caller's own can be referred to (none: secrets off, or none yet)
    names = caller_secrets
    as_object, as_list, _ = props["env"]["oneOf"]
    entry = as_list["items"]
    if names:
        ref = copy.deepcopy(SECRET_REF_SCHEMA)
        ref["properties"]["secret"] = {"enum": names}
        value: dict[str, Any] = {"oneOf": [_ENV_TEXT, ref]}
        entry["properties"]["secret"] = {"enum": names}
    else:
        value = _ENV_TEXT
        del entry["properties"]["secret"], entry["oneOf"]
        entry["required"] = ["name", "value"]
    as_object["additionalProperties"] = entry["properties"]["value"] = value
    git_secret = props["git"]["items"]["properties"]["secret"]
    props["git"]["items"]["properties"]["secret"] = {
        "enum": [*names, None, ""],
        "description": git_secret.get("description", ""),
    }
    if not git:
        props["git"] = {
            "type": ["array", "null"],
            "maxItems": 0,
            "description": "Git repositories are not enabled on this platform.",
        }
    schema["allOf"] = [
        *schema["allOf"],
        {"anyOf": named},
        {"anyOf": sized},
        {"anyOf": _gang_branches(flavors, gpus_any, quota_gpus, quota_jobs, gang_slots or {})},
    ]
    props["workers"]["maximum"] = max(1, min(MAX_WORKERS, max_workers))
    tasks = max(1, min(MAX_COMPLETIONS, max_tasks))  # a job array's, the site's cap
    for key in ("completions", "parallelism"):
        props[key]["maximum"] = tasks
    props["parameters"]["maxItems"] = tasks
    _narrow_notify(props["notify"], notify_rules or NotifyRules())
    return schema


def _narrow_notify(notify: dict[str, Any], rules: NotifyRules) -> None:
    """The ``notify`` field as this site takes it: the hosts and domains the admin allows
    said in the descriptions (a pattern cannot say them all), a channel that is off shut."""
    props = notify["properties"]
    off = {"type": ["string", "null"], "maxLength": 0}
    if rules.webhook_hosts:
        props["webhook"]["description"] += (
            f" Hosts allowed here: {', '.join(rules.webhook_hosts)} (a pattern without a "
            "port: the scheme's default port)."
        )
    else:
        props["webhook"] = {**off, "description": "Webhooks are not enabled on this platform."}
    if rules.mail and rules.mail_domains:
        props["email"]["description"] += f" Domains allowed here: {', '.join(rules.mail_domains)}."
    else:
        props["email"] = {**off, "description": "E-mail is not enabled on this platform."}
    branches = {
        "webhook": bool(rules.webhook_hosts),
        "email": rules.mail and bool(rules.mail_domains),
    }
    notify["anyOf"] = [b for b in notify["anyOf"] if branches.get(b.get("required", [""])[0])] + [
        {"type": "null"}
    ]
