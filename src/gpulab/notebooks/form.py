"""The spawn form, and what the hub checks of a notebook's options before anything starts
(the form's and the REST API's alike): the catalog, flavors, free GPUs, missing images, and a
GPU notebook's image that needs a newer CUDA than the host's driver supports."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..cuda import cuda_refusal
from ..durations import format_duration
from ..gpus.ledger import GpuLedger
from ..gpus.placement import Want, free_by_model
from ..gpus.sharing import fraction_refusal, offered_fractions
from ..resources import beyond_gpus, format_memory
from ..runtime.base import Runtime
from .options import NotebookOptions, OptionsError, parse_notebook_options

log = logging.getLogger("gpulab.notebooks")

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


class OptionsRefused(ValueError):
    """Options the hub answers 400 to; the message starts with the field at fault."""


def want_of(opts: NotebookOptions) -> Want:
    """The GPU model and node pool a notebook's options ask for."""
    return Want(opts.gpu_model, opts.node_pool)


def refusal_text(field: str, message: str) -> str:
    """A refusal of :meth:`GpuLedger.want_refusal` as an option's: "OPTION: message"."""
    option = "gpus" if field in ("resources.gpus", "workers") else field
    return message if message.startswith(f"{option}: ") else f"{option}: {message}"


def parse_options(settings, user: str, groups: list[str], user_options: dict) -> NotebookOptions:
    s = settings
    return parse_notebook_options(
        user_options or {},
        s.catalog,
        s.flavor_map,
        s.limits_for(user, groups),
        s.default_flavor or None,
        frozenset(s.allowed_images),
        storage=s.storage,
        user=user,
        workspace_dir=s.workspace_dir,
        gpu_idle_timeout=s.gpu_idle_timeout,
        cpu_idle_timeout=s.cpu_idle_timeout,
        gpu_unused_timeout=s.gpu_unused_timeout,
        gpu_wait=s.notebook_gpu_wait,
        notify_rules=s.notify_rules,
        image_registries=tuple(s.image_registries),
        default_pull_policy=s.image_pull_policy,
        home_dir=s.home_dir if s.home_sync else "",
    )


async def missing_images(settings, runtime: Runtime) -> dict[str, str]:
    """{image: reason} of the catalog's images the engine does not have (on a Swarm: the
    registry), each asked at most every IMAGE_CHECK_TTL seconds (the runtime's cache)."""
    s = settings
    return s.catalog.unavailable(
        await runtime.missing_images(s.catalog.images()), runtime.images_at
    )


async def cuda_check(settings, runtime: Runtime, opts: NotebookOptions) -> None:
    """A GPU notebook whose image needs a newer CUDA than the driver supports is refused
    (frameworks.cuda_refusal, the rule jobs share)."""
    if not opts.resources.gpus:
        return
    build = (await runtime.image_builds([opts.image]))[opts.image]
    why = cuda_refusal(opts.image, build.cuda, opts.resources.gpus, runtime.driver_cuda)
    if why:
        framework = settings.catalog.frameworks.get(opts.framework)
        chosen = framework.version(opts.version).image if framework else None
        raise OptionsRefused(f"{'version' if chosen == opts.image else 'image'}: {why}")


async def check_options(
    settings, runtime: Runtime, ledger: GpuLedger, user: str, groups: list[str], user_options
) -> NotebookOptions:
    """Validate options (form and API alike); raises OptionsRefused with the message."""
    try:
        opts = parse_options(settings, user, groups, user_options)
    except OptionsError as e:
        # "FIELD: message": the form shows it next to that field (a cap's message, such as
        # "volumes: at most 32 entries (got 4000)", already starts so)
        msg = str(e) if str(e).startswith(f"{e.field}: ") else f"{e.field}: {e}"
        raise OptionsRefused(msg) from None
    why = fraction_refusal(opts.resources.gpus, list(settings.gpu_sharing.values()))
    if why:
        raise OptionsRefused(f"gpus: {why}")
    if ledger.clustered:
        # the cluster's inventory is read at the reservation, which refuses a request no
        # node can hold, naming the biggest node (ledger.NoGpuAvailable)
        most, where = ledger.gpu_home() if ledger.devices else (None, "")
    else:
        most, where = len(ledger.devices), "this host"
    too_many = (
        None if most is None else beyond_gpus(opts.resources.gpus, most, where, option="gpus")
    )
    if too_many:
        raise OptionsRefused(f"gpus: {too_many}")
    want = want_of(opts)
    if want and not ledger.clustered:  # a cluster's devices are read at the reservation
        why = ledger.want_refusal(want, opts.resources.gpus)
        if why:
            raise OptionsRefused(refusal_text(*why))
    unavailable = await missing_images(settings, runtime)
    if opts.image in unavailable:
        raise OptionsRefused(f"version: {unavailable[opts.image]}")
    await cuda_check(settings, runtime, opts)
    return opts


async def render_form(settings, runtime: Runtime, ledger: GpuLedger, user: str, groups) -> str:
    s = settings
    limits = s.limits_for(user, groups)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    try:
        free = await asyncio.to_thread(ledger.free_count)
        shared = await asyncio.to_thread(ledger.shared_free)
        models = await asyncio.to_thread(ledger.free_by_model)
    except Exception:  # the form must render even if the ledger is unreachable
        log.exception("cannot read the GPU ledger")
        # the models stay on offer (a choice the spawn checks), how many are free unknown
        free, shared = None, {}
        models = [{**m, "free": None} for m in free_by_model(ledger.devices, ())]
    idle = {f.id: s.idle_timeout_for(f.id, f.resources) for f in s.flavor_map.values()}
    unused = {f.id: s.gpu_unused_timeout_for(f.id, f.resources) for f in s.flavor_map.values()}
    unavailable = await missing_images(s, runtime)
    return env.get_template("spawn_form.html").render(
        catalog=s.catalog,
        unavailable=unavailable,
        builds=await runtime.image_builds(s.catalog.images()),
        driver_cuda=runtime.driver_cuda,
        unavailable_frameworks=s.catalog.unavailable_frameworks(unavailable),
        flavors=list(s.flavor_map.values()),
        idle={fid: format_duration(t) for fid, t in idle.items() if t > 0},
        gpu_unused={fid: format_duration(t) for fid, t in unused.items() if t > 0},
        flavor_titles={f.id: f.title for f in s.flavor_map.values()},
        gpu_idle=format_duration(s.gpu_idle_timeout) if s.gpu_idle_timeout > 0 else "",
        cpu_idle=format_duration(s.cpu_idle_timeout) if s.cpu_idle_timeout > 0 else "",
        default_flavor=s.default_flavor,
        limits=limits,
        limit_memory=format_memory(limits.memory),
        gpus_total=len(ledger.devices),
        gpus_free=free,
        # the models (each with its free and total GPUs) and pools a notebook may ask for
        models=models,
        pools=ledger.known_pools(),
        fractions=offered_fractions(list(s.gpu_sharing.values())),
        shared=shared,
        # the biggest share one shared GPU has free now (for the form's warning)
        shared_most_free=max((f / n for f, n in shared.values()), default=0),
        stores=s.storage.stores,
        registries=list(s.image_registries),
        grants=[g for g in s.storage.grants if g.users is None or user in g.users],
        workspace=s.storage.workspace,
        workspace_dir=s.workspace_dir,
        gpu_idle_timeout=s.gpu_idle_timeout,
        cpu_idle_timeout=s.cpu_idle_timeout,
        # the notices a notebook may ask for: the admin's hosts and domains (none: hidden)
        notify_webhooks=s.notify_rules.webhook_hosts,
        notify_mail=s.notify_rules.mail_domains if s.notify_rules.mail else (),
    )
