"""Field checks both doors share (pure): the notebook options
(:mod:`gpulab.notebooks.options`) and the job spec (:mod:`gpulab.jobs.spec`) refuse the same
faults with the same messages, written once here.

Each check takes the error class of its door (a :class:`~gpulab.errors.FieldError`: the
options' ``OptionsError``, the spec's ``JobSpecError``) and the field's name, and raises
``error(field, message)``. Where the two doors differ (the spawn form posts text where the API
posts numbers and booleans), a parameter names the difference; each door keeps its messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from . import imagerefs
from .bounds import (
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_VOLUME_SPEC_CHARS,
    MAX_VOLUMES,
    check_chars,
    check_count,
    shown,
)
from .errors import FieldError
from .frameworks import Catalog, CatalogError, Editor, Framework, FrameworkVersion
from .names import LABEL_PREFIX
from .resources import (
    Flavor,
    Limits,
    ResourceError,
    Resources,
    check_gpu_model,
    check_node_pool,
    model_key,
    resolve_resources,
)
from .storage import StorageConfig
from .volumes import VolumeError, VolumeSpec

#: a secret's name: what a job's env or git entry refers to (``{"secret": "wandb"}``); the
#: pattern is the JSON Schema's too (jobs/spec/schema.py, the API's secret paths)
SECRET_NAME_PATTERN = "^[a-z0-9][a-z0-9._-]{0,62}$"
SECRET_NAME_RE = re.compile(SECRET_NAME_PATTERN)
MAX_SECRET_NAME_CHARS = 63
#: why no secret can be stored, revealed or referred to here: the secrets API's 503
#: (:data:`gpulab.secrets.NO_KEY`) and a job spec's refusal of a reference to one alike
NO_SECRETS_KEY = (
    "secrets are not enabled: the admin has configured no key "
    "(c.GpulabSettings.secrets_keys or secrets_key_file)"
)
#: how long an unknown or invalid key may be where it names the field at fault
MAX_KEY_TEXT = 64
#: a label's key: what a job's and a notebook's labels may be named (^...$ for the JSON
#: Schema's ECMA pattern; the check uses re.fullmatch)
LABEL_KEY_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
#: label namespaces a job or notebook may not use: gpulab's own (ownership!) and Docker's
RESERVED_LABEL_PREFIXES = (LABEL_PREFIX, "com.docker.", "io.docker.", "org.dockerproject.")

Error = type[FieldError]


def type_name(value: object) -> str:
    """``str``, ``int``, ``list``... and ``null`` for None: the JSON door's refusals say it."""
    return type(value).__name__ if value is not None else "null"


def key_text(key: object) -> str:
    """An unknown or invalid key as it appears in ``field``: cut to 64 characters."""
    text = str(key)
    return text if len(text) <= MAX_KEY_TEXT else text[:MAX_KEY_TEXT] + "..."


def first_unknown(value: Mapping, known: Collection[str]) -> object | None:
    """The first key (in the body's order) that is not ``known``; stops there, whatever the
    number of keys (no set difference or sort of a huge object)."""
    return next((k for k in value if k not in known), None)


def not_text(field: str, value: object, *, typed: bool = True) -> str:
    """The refusal of a value that is not a string: ``name must be a string, not int 12``;
    not ``typed``, without the type (the notebook form's door, a job's git entries)."""
    what = f"{type_name(value)} {shown(value)}" if typed else shown(value)
    return f"{field} must be a string, not {what}"


def text(error: Error, field: str, value: object, cap: int, *, typed: bool = True) -> str:
    """A string (empty too) of at most ``cap`` characters (:func:`not_text`,
    :func:`gpulab.bounds.check_chars`)."""
    if not isinstance(value, str):
        raise error(field, not_text(field, value, typed=typed))
    check_chars(error, field, value, cap)
    return value


def optional_text(
    error: Error,
    field: str,
    value: object,
    cap: int,
    *,
    form: bool = False,
    typed: bool | None = None,
) -> str | None:
    """None and "" mean absent; anything else must be a string of at most ``cap`` characters.

    ``form``: the notebook options' door, where a number stands for its text (the spawn form
    and ``user_options`` alike) and a refusal does not name the value's type. ``typed``:
    whether a refusal names the type (by default, everywhere but the form)."""
    if value is None or value == "":
        return None
    if form and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return text(error, field, value, cap, typed=not form if typed is None else typed)


def want(
    error: Error,
    gpu_model: object,
    node_pool: object,
    flavor: Flavor | None,
    *,
    form: bool = False,
) -> tuple[str, str]:
    """A request's ``gpu_model`` and ``node_pool`` ("" for any), each a name (refused naming
    its field); a ``flavor``'s are the default, which a request may repeat but not change
    (a flavor such as "a100-large" stands for its model: it is not widened nor swapped)."""
    out = []
    for field, value, check, fixed, same in (
        ("gpu_model", gpu_model, check_gpu_model, flavor and flavor.gpu_model, model_key),
        ("node_pool", node_pool, check_node_pool, flavor and flavor.node_pool, str.casefold),
    ):
        given = optional_text(error, field, value, 64, form=form)
        if given is not None:
            try:
                check(given, field)
            except ValueError as e:
                raise error(field, str(e)) from None
        if fixed:
            if given is not None and same(given) != same(fixed):
                raise error(
                    field,
                    f"{field}: flavor {flavor.id!r} runs on {fixed!r}: leave {field} out, or "
                    "choose another flavor",
                )
            given = fixed
        out.append(given or "")
    return out[0], out[1]


def flag(error: Error, field: str, value: object, *, words: bool = False) -> bool:
    """True or false. ``words``: the spawn form's text too (``on``, ``yes``, ``1``, ``true``;
    ``off``, ``no``, ``0``, ``false``, empty)."""
    if isinstance(value, bool):
        return value
    if words and isinstance(value, str) and value.lower() in ("true", "on", "1", "yes"):
        return True
    if words and isinstance(value, str) and value.lower() in ("false", "off", "0", "no", ""):
        return False
    raise error(field, f"{field} must be true or false, not {shown(value)}")


def catalog_version(
    error: Error, catalog: Catalog, framework: str | None, version: str | None
) -> tuple[Framework, FrameworkVersion]:
    """The catalog's framework and version (its defaults for None), refused as the catalog
    words it."""
    try:
        fw = catalog.framework(framework)
        return fw, fw.version(version)
    except CatalogError as e:
        raise error(e.field, str(e)) from None


def catalog_editor(error: Error, catalog: Catalog, fw: Framework, editor: str | None) -> Editor:
    """One of the editors ``fw`` offers (its first for None)."""
    try:
        return catalog.editor(fw, editor)
    except CatalogError as e:
        raise error(e.field, str(e)) from None


def image_choice(
    error: Error,
    image: str,
    catalog: Catalog,
    allowed_images: Iterable[str],
    *,
    registries: Iterable[str] = (),
    echo: Callable[[object], str] = repr,
) -> str:
    """An image named outright: one of the catalog's, one the admin allowed, or one from a
    registry and repository the admin's ``registries`` patterns allow (an image outside all
    three would let a user run anything on the host's engine). ``echo`` shows the refused name
    (the notebook options cut it short with :func:`~gpulab.bounds.shown`)."""
    allowed = frozenset(allowed_images)
    if image in allowed or image in catalog.images():
        return image
    patterns = tuple(registries)
    if patterns:
        try:
            ref = imagerefs.parse(image)
        except imagerefs.ImageRefError as e:
            raise error("image", f"image {echo(image)}: {e}") from None
        if imagerefs.allowed(ref, patterns):
            return image
    raise error(
        "image",
        f"image {echo(image)} is not in the catalog; choose a framework and version"
        + (f", or one of: {', '.join(sorted(allowed))}" if allowed else "")
        + (f", or an image from: {', '.join(patterns)}" if patterns else ""),
    )


def from_registry(image: str, catalog: Catalog, allowed_images: Iterable[str]) -> bool:
    """Whether ``image`` (already accepted by :func:`image_choice`) comes from a registry:
    neither the catalog's nor one of the admin's allowed images, which the engine holds."""
    return image not in catalog.images() and image not in frozenset(allowed_images)


def image_pull(
    error: Error,
    raw: Mapping[str, Any],
    registry_image: bool,
    secret_check: Callable[[str, str], None],
) -> tuple[str | None, str | None]:
    """``image_pull_policy`` and ``image_pull_secret`` of a request: (policy or None for the
    site's default, the name of the owner's secret that holds the registry's credentials, or
    None). Both only for an image from a registry. ``secret_check(field, name)`` refuses a
    secret the owner does not have."""
    policy = raw.get("image_pull_policy") or None  # "" is absent, as for every text field
    secret = raw.get("image_pull_secret") or None
    for key, value in (("image_pull_policy", policy), ("image_pull_secret", secret)):
        if value is not None and not registry_image:
            raise error(key, f"{key} is only for an image from a registry (image_registries)")
    if policy is not None:
        try:
            policy = imagerefs.check_policy(policy)
        except imagerefs.ImageRefError as e:
            raise error("image_pull_policy", str(e)) from None
    if secret is not None:
        secret = secret_name(error, "image_pull_secret", secret)
        secret_check("image_pull_secret", secret)
    return policy, secret


def resources(
    error: Error,
    flavors: Mapping[str, Flavor],
    limits: Limits,
    flavor: str | None,
    request: Mapping[str, Any],
    *,
    prefix: str = "",
) -> Resources:
    """CPUs, memory and GPUs from a flavor and explicit values, within ``limits`` and the sane
    ranges of :mod:`gpulab.bounds`. ``prefix`` is put before a refused value's field
    (``resources.``), never before ``flavor``."""
    try:
        return resolve_resources(flavors, limits, flavor, **request)
    except ResourceError as e:
        raise error(e.field if e.field == "flavor" else prefix + e.field, str(e)) from None


def volume_list(
    error: Error,
    value: object,
    storage: StorageConfig | None,
    user: str,
    workspace_dir: str,
    *,
    example: str,
) -> list[VolumeSpec]:
    """A list of volume specs the user may mount, capped before each is parsed and checked
    against the grants. ``example``: the spec shown when the list is malformed."""
    help_ = f"volumes must be a list of strings such as {example!r}"
    if not isinstance(value, list):
        raise error("volumes", help_)
    check_count(error, "volumes", len(value), MAX_VOLUMES)
    for v in value:
        if not isinstance(v, str):
            raise error("volumes", help_)
        if len(v) > MAX_VOLUME_SPEC_CHARS:
            raise error(
                "volumes",
                f"volumes: at most {MAX_VOLUME_SPEC_CHARS} characters per volume (got {len(v)})",
            )
    if storage is None or not storage.stores:
        raise error("volumes", "no object store is configured on this platform")
    try:
        return storage.user_volumes(user, value, workspace_dir)
    except VolumeError as e:
        raise error("volumes", str(e)) from None


def labels(error: Error, value: object, field: str = "labels") -> dict[str, str]:
    """A job's or a notebook's labels: an object of at most MAX_LABELS ``key: value``
    strings, each key LABEL_KEY_RE and outside RESERVED_LABEL_PREFIXES, each value at most
    MAX_LABEL_VALUE_CHARS; None: none. A key at fault is named ``labels.KEY``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(field, f"{field} must be an object of key: value strings, not {shown(value)}")
    check_count(error, field, len(value), MAX_LABELS)
    found: dict[str, str] = {}
    for name, item in value.items():
        key = f"{field}.{key_text(name)}"
        if (
            not isinstance(name, str)
            or len(name) > MAX_LABEL_KEY_CHARS
            or not LABEL_KEY_RE.fullmatch(name)
        ):
            raise error(
                key,
                f"label key {shown(name)} must be 1 to {MAX_LABEL_KEY_CHARS} lowercase letters, "
                "digits, '.', '_' or '-', starting and ending with a letter or digit",
            )
        if name.startswith(RESERVED_LABEL_PREFIXES):
            raise error(
                key,
                f"label key {name!r} is reserved: keys starting with "
                f"{', '.join(RESERVED_LABEL_PREFIXES)} cannot be set",
            )
        found[name] = text(error, key, item, MAX_LABEL_VALUE_CHARS)
    return found


def label_filters(error: Error, items: Iterable[str], field: str = "label") -> dict[str, str]:
    """``key=value`` filters of a list (``?label=team=a``, repeatable) as {key: value}; one
    without ``=`` is refused naming ``field``. Only equal values match: the filter never
    needs the label's own checks (a key no label has matches nothing)."""
    wanted: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise error(field, "label filters are key=value")
        k, v = item.split("=", 1)
        wanted[k] = v
    return wanted


def secret_name(error: Error, field: str, name: object) -> str:
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


def json_object(raw: bytes | None) -> dict:
    """A request's body as a JSON object (an empty body is ``{}``) of Unicode text; else a
    FieldError on ``body``."""
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        raise FieldError("body", "the body must be a JSON object") from None
    if not isinstance(data, dict):
        raise FieldError("body", "the body must be a JSON object")
    try:  # JSON's \\u escapes can write half a surrogate pair, which is no Unicode text
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise FieldError(
            "body", "the body holds an unpaired surrogate (\\ud800 to \\udfff): not Unicode text"
        ) from None
    except RecursionError:  # (as deep as the parser took, past what the encoder takes)
        raise FieldError("body", "the body must be a JSON object") from None
    return data
