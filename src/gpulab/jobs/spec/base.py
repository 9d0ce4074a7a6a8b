"""What every part of a job spec shares (pure): the error, the defaults and caps, the paths,
the field names, and the rules that the parser and the JSON Schema both follow (patterns,
reserved names)."""

from __future__ import annotations

import re

from ... import checks
from ...bounds import MAX_LABEL_VALUE_CHARS, MAX_NAME_CHARS
from ...errors import FieldError


class JobSpecError(FieldError):
    """An invalid submission; ``field`` names the (dotted) field, the message what is allowed."""


#: what a text field takes for "absent" (None and "", as the parsers read them)
ABSENT_TEXT = [None, ""]

DEFAULT_TIMEOUT = 7 * 86400.0
MAX_TIMEOUT = 30 * 86400.0
DEFAULT_HANG_PERIOD = 1800.0
MIN_HANG_PERIOD = 10.0
MAX_RETRIES = 128
#: workers of one distributed job (containers, each with ``resources``)
MAX_WORKERS = 64
DEFAULT_PRIORITY = 50
MAX_PRIORITY = 100
#: how long after its end a job's record, history and saved logs may be kept, when it says
#: (``auto_delete_after``): at least a minute (the service looks once a minute), at most ten
#: years (a site's ``job_retention_max`` may say less)
MIN_RETENTION = 60.0
MAX_RETENTION = 3650 * 86400.0
DEFAULT_CPUS = 1.0
DEFAULT_MEMORY = "4G"
DEFAULT_GPUS = 1
# the caps on lists and strings live in gpulab.bounds (docs/limits.md); these names stay
MAX_LABEL_VALUE = MAX_LABEL_VALUE_CHARS
MAX_NAME = MAX_NAME_CHARS
#: the longest path a job names (its working directory, a repository's checkout)
MAX_PATH_CHARS = 1024
WORKSPACE_DIR = "/workspace"
#: where a repository may not be mounted nor a job work: the system's trees and gpulab's own
SYSTEM_DIRS = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/run",
    "/opt/gpulab",
)

#: the top-level fields of a submission, in the order of :meth:`JobSpec.to_json`
JOB_SPEC_FIELDS = (
    "name",
    "framework",
    "version",
    "image",
    "image_pull_policy",
    "image_pull_secret",
    "command",
    "args",
    "env",
    "labels",
    "flavor",
    "resources",
    "gpu_model",
    "node_pool",
    "workers",
    "completions",
    "parallelism",
    "parameters",
    "volumes",
    "timeout",
    "retries",
    "hang_restart",
    "preemptible",
    "terminate_after_preemption",
    "priority",
    "ports",
    "git",
    "working_dir",
    "read_only_rootfs",
    "notify",
    "auto_delete_after",
    "sync_interval",
)
RESOURCE_FIELDS = ("cpus", "memory", "gpus")
HANG_RESTART_FIELDS = ("enabled", "period")

#: environment variable names a job may not set: the platform's own and its credentials
RESERVED_ENV_PREFIXES = ("JUPYTERHUB_", "GPULAB_", "AWS_")
RESERVED_ENV_NAMES = frozenset({"NVIDIA_VISIBLE_DEVICES"})
#: label namespaces a job may not use: gpulab's own (ownership!) and Docker's reserved ones
#: (one rule with the notebooks' labels: gpulab.checks)
RESERVED_LABEL_PREFIXES = checks.RESERVED_LABEL_PREFIXES

# ^...$ for the JSON Schema's (ECMA) patterns; the parser uses re.fullmatch, since Python's "$"
# also matches before a trailing newline ("train\n" is not a name)
NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY_RE = checks.LABEL_KEY_RE
#: white space, as a regex character class body: what Python's str.isspace() and
#: ECMAScript's \s call white space, together. A command of nothing else is blank; the JSON
#: Schema's patterns use the same class, so the schema and the parser agree on every character
BLANK_CLASS = r"\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
#: a memory size as :func:`gpulab.resources.parse_memory` reads it (the schema's pattern)
MEMORY_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[KMGTkmgt]?([Ii]?[Bb])?\s*$"
DURATION_PATTERN = (
    r"^(?=.*\d)\s*(\d+(\.\d+)?|(\d+(\.\d+)?[dD])?\s*(\d+(\.\d+)?[hH])?\s*"
    r"(\d+(\.\d+)?[mM])?\s*(\d+(\.\d+)?[sS])?)\s*$"
)


def check_secret(field: str, name: str, secret_names: frozenset[str] | None) -> None:
    """Refuse a reference to a secret the owner does not have (or any, with secrets off:
    the secrets API's own refusal, :data:`gpulab.checks.NO_SECRETS_KEY`)."""
    if secret_names is None:
        raise JobSpecError(field, checks.NO_SECRETS_KEY)
    if name not in secret_names:
        raise JobSpecError(
            field, f"you have no secret {name!r}: create it with `gpulab secret set {name}`"
        )


def secret_name(field: str, value: object) -> str:
    """A secret's name as an env value or a git entry gives it, refused as ``field: ...``."""
    try:
        return checks.secret_name(FieldError, field, value)
    except FieldError as e:
        raise JobSpecError(field, f"{field}: {e}") from None
