"""The notebook spawner's options: the spawn form, and the validation of what it (or the REST
API) sends, before anything starts.

A mixin over DockerSpawner, like :mod:`gpulab.spawner_network`: it needs ``settings``,
``ledger`` and ``runtime`` from :class:`~gpulab.spawner.NotebookSpawner`.
"""

from __future__ import annotations

from pathlib import Path

from dockerspawner import DockerSpawner
from jinja2 import Environment, FileSystemLoader, select_autoescape
from tornado import web
from traitlets import default

from .durations import format_duration
from .gpus.sharing import fraction_refusal, offered_fractions
from .notebooks.options import (
    NotebookOptions,
    OptionsError,
    form_to_options,
    parse_notebook_options,
)
from .resources import format_memory
from .runtime.images import ImageCache

TEMPLATES = Path(__file__).parent / "templates"
#: seconds an answer of the engine about an image (there or not) is trusted
IMAGE_CHECK_TTL = 30.0
#: shared by a hub's spawners
_images = ImageCache(IMAGE_CHECK_TTL)


class NotebookOptionsMixin(DockerSpawner):
    gpulab_options: NotebookOptions | None = None

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return lambda spawner, user_options: spawner.apply_notebook_options(user_options)

    @default("options_form")
    def _default_options_form(self):
        return lambda spawner: spawner.render_options_form()

    @default("options_from_form")
    def _default_options_from_form(self):
        return lambda formdata: form_to_options(formdata)

    # --- options --------------------------------------------------------------------------

    def _user_groups(self) -> list[str]:
        return [g.name for g in getattr(self.user, "groups", [])]

    def parse_options(self, user_options: dict) -> NotebookOptions:
        s = self.settings
        return parse_notebook_options(
            user_options or {},
            s.catalog,
            s.flavor_map,
            s.limits_for(self.user.name, self._user_groups()),
            s.default_flavor or None,
            frozenset(s.allowed_images),
            storage=s.storage,
            user=self.user.name,
            workspace_dir=s.workspace_dir,
            gpu_idle_timeout=s.gpu_idle_timeout,
            cpu_idle_timeout=s.cpu_idle_timeout,
        )

    async def missing_images(self) -> dict[str, str]:
        """{image: reason} of the catalog's images the engine does not have (on a Swarm: the
        registry), each asked at most every IMAGE_CHECK_TTL seconds."""
        s = self.settings
        missing = await _images.missing(self.runtime, s.catalog.images(), self.engine_image)
        where = "in the registry" if self.clustered else "on this host"
        return s.catalog.unavailable(missing, where)

    async def apply_notebook_options(self, user_options: dict) -> None:
        """Validate options (form and API alike); JupyterHub answers 400 with our message."""
        try:
            opts = self.parse_options(user_options)
        except OptionsError as e:
            # "FIELD: message": the form shows it next to that field (a cap's message, such as
            # "volumes: at most 32 entries (got 4000)", already starts so)
            msg = str(e) if str(e).startswith(f"{e.field}: ") else f"{e.field}: {e}"
            raise web.HTTPError(400, "Invalid notebook options: %s", msg) from None
        why = fraction_refusal(opts.resources.gpus, list(self.settings.gpu_sharing.values()))
        if why:
            raise web.HTTPError(400, "Invalid notebook options: gpus: %s", why)
        if self.ledger.clustered:
            # the cluster's inventory is read at the reservation, which refuses a request no
            # node can hold, naming the biggest node (ledger.NoGpuAvailable)
            most, where = self.ledger.gpu_home() if self.ledger.devices else (None, "")
        else:
            most, where = len(self.ledger.devices), "this host"
        if most is not None and opts.resources.gpus > most:
            raise web.HTTPError(
                400,
                "Invalid notebook options: gpus: %s",
                f"gpus={opts.resources.gpus:g} requested but {where} has {most} GPU(s)",
            )
        unavailable = await self.missing_images()
        if opts.image in unavailable:
            raise web.HTTPError(
                400, "Invalid notebook options: version: %s", unavailable[opts.image]
            )
        self.gpulab_options = opts
        self.image = opts.image
        self.default_url = opts.default_url

    async def render_options_form(self) -> str:
        """JupyterHub awaits an async options_form: the ledger is read off the event loop."""
        s = self.settings
        limits = s.limits_for(self.user.name, self._user_groups())
        env = Environment(
            loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"])
        )
        try:
            free = await self.runtime.run(self.ledger.free_count)
            shared = await self.runtime.run(self.ledger.shared_free)
        except Exception:  # the form must render even if the ledger is unreachable
            self.log.exception("cannot read the GPU ledger")
            free, shared = None, {}
        idle = {f.id: s.idle_timeout_for(f.id, f.resources) for f in s.flavor_map.values()}
        unavailable = await self.missing_images()
        return env.get_template("spawn_form.html").render(
            catalog=s.catalog,
            unavailable=unavailable,
            unavailable_frameworks=s.catalog.unavailable_frameworks(unavailable),
            flavors=list(s.flavor_map.values()),
            idle={fid: format_duration(t) for fid, t in idle.items() if t > 0},
            gpu_idle=format_duration(s.gpu_idle_timeout) if s.gpu_idle_timeout > 0 else "",
            cpu_idle=format_duration(s.cpu_idle_timeout) if s.cpu_idle_timeout > 0 else "",
            default_flavor=s.default_flavor,
            limits=limits,
            limit_memory=format_memory(limits.memory),
            gpus_total=len(self.ledger.devices),
            gpus_free=free,
            fractions=offered_fractions(list(s.gpu_sharing.values())),
            shared=shared,
            # the biggest share one shared GPU has free now (for the form's warning)
            shared_most_free=max((f / n for f, n in shared.values()), default=0),
            sharing_mode=s.gpu_sharing_mode,
            stores=s.storage.stores,
            grants=[g for g in s.storage.grants if g.users is None or self.user.name in g.users],
            workspace=s.storage.workspace,
            workspace_dir=s.workspace_dir,
            gpu_idle_timeout=s.gpu_idle_timeout,
            cpu_idle_timeout=s.cpu_idle_timeout,
        )
