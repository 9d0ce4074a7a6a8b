"""Validate a notebook's user options, in one place for the form and the REST API alike.

JupyterHub hands the spawner a dict: from the form (after ``options_from_form``) or straight
from ``POST /hub/api/users/NAME/servers/SERVER`` with ``user_options``. Both pass through
:func:`parse_notebook_options`, so the API cannot reach what the form would refuse.

It runs on the hub's event loop: every option is capped (:mod:`gpulab.bounds`) before any work
that grows with it, unknown options are refused, and refused values are echoed cut short.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import checks
from ..bounds import (
    MAX_ID_CHARS,
    MAX_IMAGE_CHARS,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_NUMBER_CHARS,
    MAX_VOLUME_SPEC_CHARS,
    MAX_VOLUMES,
    check_chars,
    check_count,
    shown,
)
from ..errors import FieldError
from ..frameworks import Catalog
from ..idle import gpu_unused_timeout_for, idle_timeout_for
from ..notices import EVENTS, MAX_EMAIL_CHARS, MAX_URL_CHARS, Notify, NotifyRules, parse_notify
from ..resources import Flavor, Limits, Resources, gpu_wait_for
from ..storage import StorageConfig
from ..volumes import VolumeSpec

KNOWN_OPTIONS = (
    "framework",
    "version",
    "editor",
    "flavor",
    "cpus",
    "memory",
    "gpus",
    "gpu_model",
    "node_pool",
    "image",
    "image_pull_policy",
    "image_pull_secret",
    "auto_restart",
    "volumes",
    "notify_webhook",
    "notify_email",
    "notify_on",
    "labels",
)
_KNOWN = frozenset(KNOWN_OPTIONS)
#: the longest text each option may be (volumes are capped per entry and in number)
_TEXT_CAPS = {
    "framework": MAX_ID_CHARS,
    "version": MAX_ID_CHARS,
    "editor": MAX_ID_CHARS,
    "flavor": MAX_ID_CHARS,
    "image": MAX_IMAGE_CHARS,
    "image_pull_policy": MAX_ID_CHARS,
    "image_pull_secret": checks.MAX_SECRET_NAME_CHARS,
    "cpus": MAX_NUMBER_CHARS,
    "memory": MAX_NUMBER_CHARS,
    "gpus": MAX_NUMBER_CHARS,
    "gpu_model": 64,
    "node_pool": 64,
    "auto_restart": MAX_NUMBER_CHARS,
    "notify_webhook": MAX_URL_CHARS,
    "notify_email": MAX_EMAIL_CHARS,
    "notify_on": 128,
}
#: the form sends volumes as one spec per line
_MAX_VOLUMES_TEXT = MAX_VOLUMES * (MAX_VOLUME_SPEC_CHARS + 1)
#: and labels as key=value, one per line or separated by commas
_MAX_LABELS_TEXT = MAX_LABELS * (MAX_LABEL_KEY_CHARS + MAX_LABEL_VALUE_CHARS + 2)


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
    #: seconds without activity after which it is stopped (0: never): from its flavor or the
    #: default of its kind (gpulab.idle), never from the user
    idle_timeout: float = 0.0
    #: seconds its GPUs may go unused before it is stopped (0: never): from its flavor or the
    #: site's policy (gpulab.idle), never from the user
    gpu_unused_timeout: float = 0.0
    #: seconds it may wait in the queue for its GPUs (0: it never waits): from its flavor or
    #: the site's (GpulabSettings.notebook_gpu_wait), never from the user
    gpu_wait: float = 0.0
    #: whom to tell when it stops or fails (gpulab.notices); None: nobody
    notify: Notify | None = None
    #: the GPU model and node pool its GPUs must be of ("" for any; a flavor's by default)
    gpu_model: str = ""
    node_pool: str = ""
    #: the user's labels (key: value), as a job's (gpulab.checks.labels): kept in its
    #: record, listed and filtered on (?label=k=v)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: for an image from a registry (and only then): when it is pulled, and the user's
    #: secret that holds the registry's credentials (None: an anonymous pull)
    image_pull_policy: str | None = None
    image_pull_secret: str | None = None

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
            "idle_timeout": self.idle_timeout,
            "gpu_unused_timeout": self.gpu_unused_timeout,
            "gpu_wait": self.gpu_wait,
            "notify": self.notify.to_json() if self.notify else None,
            "gpu_model": self.gpu_model or None,
            "node_pool": self.node_pool or None,
            "labels": dict(self.labels),
            **(
                {
                    "image_pull_policy": self.image_pull_policy,
                    "image_pull_secret": self.image_pull_secret,
                }
                if self.image_pull_policy
                else {}
            ),
        }


def _text(raw: Mapping, key: str) -> str | None:
    return checks.optional_text(OptionsError, key, raw.get(key), _TEXT_CAPS[key], form=True)


def _check_sizes(raw: Mapping) -> None:
    """Every option's cap, before anything else looks at the options."""
    for key, cap in _TEXT_CAPS.items():
        value = raw.get(key)
        if isinstance(value, str):
            check_chars(OptionsError, key, value, cap)
    volumes = raw.get("volumes")
    if isinstance(volumes, str):
        check_chars(OptionsError, "volumes", volumes, _MAX_VOLUMES_TEXT)
    elif isinstance(volumes, list):
        check_count(OptionsError, "volumes", len(volumes), MAX_VOLUMES)
    labels = raw.get("labels")
    if isinstance(labels, str):
        check_chars(OptionsError, "labels", labels, _MAX_LABELS_TEXT)


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
    gpu_idle_timeout: float = 0.0,
    cpu_idle_timeout: float = 0.0,
    gpu_unused_timeout: float = 0.0,
    gpu_wait: float = 0.0,
    notify_rules: NotifyRules | None = None,
    image_registries: tuple[str, ...] = (),
    default_pull_policy: str = "if-not-present",
    home_dir: str = "",
) -> NotebookOptions:
    """Turn raw user options into validated :class:`NotebookOptions` or raise OptionsError.

    ``image`` is refused unless the admin listed it in ``allowed_images`` or its registry and
    repository match one of ``image_registries`` (images outside the catalog would otherwise
    let a user run anything on the host's engine). An image from a registry keeps its pull
    policy (``default_pull_policy`` when the options give none) and the name of the user's
    pull secret, whose existence the start checks (the options are read without the user's
    secrets).
    """
    if not isinstance(raw, Mapping):
        raise OptionsError("user_options", "user_options must be an object")
    unknown = checks.first_unknown(raw, _KNOWN)
    if unknown is not None:
        raise OptionsError(
            checks.key_text(unknown),
            f"unknown option {shown(unknown)}; allowed options: {', '.join(KNOWN_OPTIONS)}",
        )
    _check_sizes(raw)
    fw, version = checks.catalog_version(
        OptionsError, catalog, _text(raw, "framework"), _text(raw, "version")
    )
    editor = checks.catalog_editor(OptionsError, catalog, fw, _text(raw, "editor"))

    image = version.image
    custom = _text(raw, "image")
    if custom is not None and custom != image:
        image = checks.image_choice(
            OptionsError, custom, catalog, allowed_images, registries=image_registries, echo=shown
        )
    registry_image = checks.from_registry(image, catalog, allowed_images)
    pull_policy, pull_secret = checks.image_pull(
        OptionsError, raw, registry_image, lambda field, name: None
    )
    if registry_image:
        pull_policy = pull_policy or default_pull_policy

    explicit = {k: raw[k] for k in ("cpus", "memory", "gpus") if raw.get(k) not in (None, "")}
    flavor = _text(raw, "flavor")
    if flavor is None and not {"cpus", "memory"} <= set(explicit):
        flavor = default_flavor
    res = checks.resources(OptionsError, flavors, limits, flavor, explicit)

    gpu_model, node_pool = checks.want(
        OptionsError,
        raw.get("gpu_model"),
        raw.get("node_pool"),
        flavors.get(flavor) if flavor else None,
        form=True,
    )
    volumes = _volumes(raw.get("volumes"), storage, user, workspace_dir, home_dir)

    return NotebookOptions(
        volumes=tuple(volumes),
        framework=fw.id,
        version=version.id,
        editor=editor.id,
        default_url=editor.default_url,
        image=image,
        flavor=flavor,
        resources=res,
        auto_restart=checks.flag(
            OptionsError, "auto_restart", raw.get("auto_restart", False), words=True
        ),
        idle_timeout=idle_timeout_for(
            flavors.get(flavor) if flavor else None, res, gpu_idle_timeout, cpu_idle_timeout
        ),
        gpu_unused_timeout=gpu_unused_timeout_for(
            flavors.get(flavor) if flavor else None, res, gpu_unused_timeout
        ),
        gpu_wait=gpu_wait_for(flavors.get(flavor) if flavor else None, res, gpu_wait),
        notify=_notify(raw, notify_rules or NotifyRules()),
        gpu_model=gpu_model,
        node_pool=node_pool,
        labels=_labels(raw.get("labels")),
        image_pull_policy=pull_policy,
        image_pull_secret=pull_secret,
    )


def _notify(raw: Mapping, rules: NotifyRules) -> Notify | None:
    """``notify_webhook``, ``notify_email`` and ``notify_on`` (a list, or names separated by
    commas: the form's) as a :class:`~gpulab.notices.Notify`, refused as a job's ``notify``
    is, naming the option; none of them: None."""
    given = {k: raw.get(f"notify_{k}") for k in ("webhook", "email", "on")}
    if all(v is None or v == "" or v == [] for v in given.values()):
        return None
    on = given["on"]
    if isinstance(on, str):
        on = [e.strip() for e in on.split(",") if e.strip()] or None
    try:
        return parse_notify({**given, "on": on}, rules, OptionsError)
    except OptionsError as e:
        field = e.field.replace("notify.", "notify_") if "." in e.field else "notify_webhook"
        message = str(e).replace("notify.", "notify_")
        if e.field == "notify":  # events alone: no one to tell
            message = "notify_webhook: give notify_webhook or notify_email (or both) to be told"
        elif field == "notify_on" and not on:
            message = f"notify_on: the events, from {', '.join(EVENTS)}"
        raise OptionsError(field, message) from None


def _volumes(
    raw, storage: StorageConfig | None, user: str, workspace_dir: str, home_dir: str = ""
) -> list:
    """A list of specs (API) or one spec per line (form); none mounted where the notebook's
    home volume is (``home_dir``, "" when homes are not kept)."""
    if raw is None or raw == "" or raw == []:
        return []
    if isinstance(raw, str):
        raw = [line.strip() for line in raw.splitlines() if line.strip()]
    volumes = checks.volume_list(
        OptionsError, raw, storage, user, workspace_dir, example="bucket@store/prefix:/mount:ro"
    )
    home = home_dir.rstrip("/")
    for v in volumes:
        if home and v.mount.rstrip("/") == home:
            raise OptionsError(
                "volumes",
                f"volumes: {v.mount} is your home's mount (kept for you between starts); "
                "mount the volume elsewhere, e.g. under it",
            )
    return volumes


def _labels(raw) -> dict[str, str]:
    """An object of key: value strings (API), or the form's text: ``key=value`` items, one
    per line or separated by commas; checked as a job's labels are
    (:func:`gpulab.checks.labels`)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        pairs: dict[str, str] = {}
        items = [i.strip() for line in raw.splitlines() for i in line.split(",")]
        for item in filter(None, items):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise OptionsError(
                    "labels", f"labels: write each label as key=value, not {shown(item)}"
                )
            check_count(OptionsError, "labels", len(pairs) + 1, MAX_LABELS)
            pairs[key.strip()] = value.strip()
        raw = pairs
    return checks.labels(OptionsError, raw)


def form_to_options(formdata: Mapping[str, list[str]]) -> dict:
    """The spawn form posts lists of strings; keep the first non-empty value of each field.

    No validation here: the result goes through :func:`parse_notebook_options` like an API call.
    """
    out: dict = {}
    for key, values in formdata.items():
        if key.startswith("_") or not values:
            continue
        if key == "notify_on":  # a box per event: every one ticked
            value = ",".join(v.strip() for v in values if v.strip())
        else:
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
