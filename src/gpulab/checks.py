"""Field checks both doors share (pure): the notebook options (:mod:`gpulab.options`) and the
job spec (:mod:`gpulab.jobs.spec`) refuse the same faults with the same messages.

Each check takes the error class of its door (a :class:`~gpulab.errors.FieldError`) and the
field's name, and raises ``error(field, message)``.
"""

from __future__ import annotations

import re

from .bounds import shown
from .errors import FieldError

#: a secret's name: what a job's env or git entry refers to (``{"secret": "wandb"}``)
SECRET_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9._-]{0,62})")
MAX_SECRET_NAME_CHARS = 63


def secret_name(error: type[FieldError], field: str, name: object) -> str:
    """A secret's name, as the secrets API and the job spec take it."""
    if (
        not isinstance(name, str)
        or len(name) > MAX_SECRET_NAME_CHARS
        or not SECRET_NAME_RE.fullmatch(name)
    ):
        raise error(
            field,
            f"a secret's name is 1 to {MAX_SECRET_NAME_CHARS} lowercase letters, digits, '.', "
            f"'_' or '-', starting with a letter or digit, not {shown(name)}",
        )
    return name
