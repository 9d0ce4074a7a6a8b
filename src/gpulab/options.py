"""Validate a notebook's user options, in one place for the form and the REST API alike.

JupyterHub hands the spawner a dict: from the form (after ``options_from_form``) or straight
from ``POST /hub/api/users/NAME/servers/SERVER`` with ``user_options``. Both pass through
:func:`parse_notebook_options`, so the API cannot reach what the form would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import FieldError
from .frameworks import Catalog, CatalogError
from .resources import Flavor, Limits, ResourceError, Resources, resolve_resources
from .storage import StorageConfig
from .volumes import VolumeError, VolumeSpec

KNOWN_OPTIONS = (
    "framework",
    "version",
    "editor",
    "flavor",
    "cpus",
    "memory",
    "gpus",
    "image",
    "auto_restart",
    "volumes",
)


class OptionsError(FieldError):
    """Invalid user options; ``field`` names the option, the message says what is allowed."""


@dataclass(frozen=True)
class NotebookOptions:
    framework: str
    version: str
    editor: str
    default_url: str
    image: str
    flavor: str | None
    resources: Resources
    auto_restart: bool
    volumes: tuple[VolumeSpec, ...] = ()

    def to_json(self) -> dict:
        return {
            "framework": self.framework,
            "version": self.version,
            "editor": self.editor,
            "image": self.image,
            "flavor": self.flavor,
            "resources": self.resources.to_json(),
            "auto_restart": self.auto_restart,
            "volumes": [str(v) for v in self.volumes],
        }


def _flag(value, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "on", "1", "yes"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "off", "0", "no", ""):
        return False
    raise OptionsError(field, f"{field} must be true or false, not {value!r}")


def _text(raw: Mapping, key: str) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise OptionsError(key, f"{key} must be a string, not {value!r}")
    return str(value)


def parse_notebook_options(
    raw: Mapping,
    catalog: Catalog,
    flavors: Mapping[str, Flavor],
    limits: Limits,
    default_flavor: str | None,
    allowed_images: frozenset[str] = frozenset(),
    storage: StorageConfig | None = None,
    user: str = "",
    workspace_dir: str = "/workspace",
) -> NotebookOptions:
    """Turn raw user options into validated :class:`NotebookOptions` or raise OptionsError.

    ``image`` is refused unless the admin listed it in ``allowed_images`` (images outside the
    catalog would otherwise let a user run anything on the host's engine).
    """
    if not isinstance(raw, Mapping):
        raise OptionsError("user_options", "user_options must be an object")
    unknown = sorted(set(raw) - set(KNOWN_OPTIONS))
    if unknown:
        raise OptionsError(
            unknown[0],
            f"unknown option {unknown[0]!r}; allowed options: {', '.join(KNOWN_OPTIONS)}",
        )
    try:
        fw = catalog.framework(_text(raw, "framework"))
        version = fw.version(_text(raw, "version"))
        editor = catalog.editor(fw, _text(raw, "editor"))
    except CatalogError as e:
        raise OptionsError(e.field, str(e)) from None

    image = version.image
    custom = _text(raw, "image")
    if custom is not None and custom != image:
        if custom not in allowed_images and custom not in catalog.images():
            raise OptionsError(
                "image",
                f"image {custom!r} is not in the catalog; choose a framework and version"
                + (f", or one of: {', '.join(sorted(allowed_images))}" if allowed_images else ""),
            )
        image = custom

    explicit = {k: raw[k] for k in ("cpus", "memory", "gpus") if raw.get(k) not in (None, "")}
    flavor = _text(raw, "flavor")
    if flavor is None and not {"cpus", "memory"} <= set(explicit):
        flavor = default_flavor
    try:
        res = resolve_resources(flavors, limits, flavor, **explicit)
    except ResourceError as e:
        raise OptionsError(e.field, str(e)) from None

    volumes = _volumes(raw.get("volumes"), storage, user, workspace_dir)

    return NotebookOptions(
        volumes=tuple(volumes),
        framework=fw.id,
        version=version.id,
        editor=editor.id,
        default_url=editor.default_url,
        image=image,
        flavor=flavor,
        resources=res,
        auto_restart=_flag(raw.get("auto_restart", False), "auto_restart"),
    )


def _volumes(raw, storage: StorageConfig | None, user: str, workspace_dir: str) -> list:
    """A list of specs (API) or one spec per line (form)."""
    if raw is None or raw == "" or raw == []:
        return []
    if isinstance(raw, str):
        raw = [line.strip() for line in raw.splitlines() if line.strip()]
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise OptionsError(
            "volumes", "volumes must be a list of strings such as 'bucket@store/prefix:/mount:ro'"
        )
    if storage is None or not storage.stores:
        raise OptionsError("volumes", "no object store is configured on this platform")
    try:
        return storage.user_volumes(user, raw, workspace_dir)
    except VolumeError as e:
        raise OptionsError("volumes", str(e)) from None


def form_to_options(formdata: Mapping[str, list[str]]) -> dict:
    """The spawn form posts lists of strings; keep the first non-empty value of each field.

    No validation here: the result goes through :func:`parse_notebook_options` like an API call.
    """
    out: dict = {}
    for key, values in formdata.items():
        if key.startswith("_") or not values:
            continue
        value = values[0].strip()
        if value != "":
            out[key] = value
    # the custom fields only count when "custom" is chosen as the flavor
    if out.get("flavor") == "custom":
        out.pop("flavor")
    else:
        for key in ("cpus", "memory", "gpus"):
            out.pop(key, None)
    return out
