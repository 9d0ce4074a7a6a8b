"""Run the gpulab service: `python -m gpulab.service --config jupyterhub_config.py`.

The hub starts it as a managed service and passes its URL, prefix and token in the environment.

`python -m gpulab.service rotate-secrets --config jupyterhub_config.py` re-encrypts every
user's secret with the first configured key (after putting a new key first), so that the old
one can be dropped, and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from prometheus_client import REGISTRY

from .. import __version__, logscrub
from ..bounds import body_backstop
from ..db import Database, SchemaMismatch
from ..jobs.supervisor.supervisor import JobSupervisor
from ..loopwatch import LoopWatch, lag_loop, settle_heap
from ..loopwatch import metrics as loop_metrics
from ..metrics import GpuUsageCollector, StateCollector
from ..notebooks.records import NotebookRecords
from ..runtime import EngineError, make_runtime, pools_warning, users_counted
from ..secrets import store_for
from ..settings import ConfigError, GpulabSettings, load_config
from ..statelog import json_formatter, register_sensitive
from .app import make_app
from .tasks.checkpoint import checkpoint_loop
from .tasks.idle import idle_loop
from .tasks.live_push import live_push_loop
from .tasks.retention import retention_loop
from .tasks.watchdog import watchdog_loop

log = logging.getLogger("gpulab.service")


async def follow_parent() -> None:
    """Exit when the hub that started us is gone, so a restarted hub can start a fresh service."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1)
    log.warning("the hub (pid %d) is gone; exiting", parent)
    os._exit(0)


def rotate_secrets(config: str | None) -> None:
    """Re-encrypt every secret of the installation with the first key (SecretStore.rotate)."""
    if not config:
        raise SystemExit("rotate-secrets needs --config (the hub's jupyterhub_config.py)")
    settings = GpulabSettings(config=load_config(config))
    count = store_for(settings, Database(settings.database_url)).rotate()
    print(f"re-encrypted {count} secrets with the first key")


def readings_from(loop: asyncio.AbstractEventLoop, read) -> Callable[[], list]:
    """A blocking reader of the GPUs' readings for the metrics' collector (which runs on a
    worker thread): ``read`` (``JobContext.gpu_readings``) run on the service's loop; [] when
    it takes longer than a scrape should wait."""

    def blocking() -> list:
        try:
            return asyncio.run_coroutine_threadsafe(read(), loop).result(timeout=20)
        except Exception as e:  # concurrent.futures.TimeoutError among them
            log.warning("GPU usage not read for /metrics: %s", e)
            return []

    return blocking


async def warn_of_address_pools(runtime, settings: GpulabSettings, config) -> None:
    """A WARNING when the engine's address pools hold fewer networks than the users counted
    on (JupyterHub's active_server_limit, else 50), each holding one (``runtime.pools``' rule,
    the one ``gpulab doctor`` judges by); nothing to say on a Swarm (its overlays come from
    the swarm's own pool) or without a network per user."""
    if settings.network_isolation != "user" or runtime.clustered:
        return
    users, counted = users_counted(config)
    warning = pools_warning(await runtime.survey((), settings.instance), users, counted)
    if warning:
        log.warning("%s", warning)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpulab-service", description=__doc__)
    parser.add_argument(
        "action", nargs="?", choices=["run", "rotate-secrets"], default="run", help="(run)"
    )
    parser.add_argument("--config", help="the hub's jupyterhub_config.py")
    args = parser.parse_args(argv)
    if args.action == "rotate-secrets":
        rotate_secrets(args.config)
        return
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s"
    )
    try:
        config = load_config(args.config)
        settings = GpulabSettings(config=config)
    except ConfigError as e:
        log.error("invalid configuration: %s", e)
        sys.exit(2)
    # each callback that holds the loop past event_loop_watch, logged (bench/bench_loop.py)
    watch = None
    if settings.event_loop_watch:
        watch = LoopWatch(settings.event_loop_watch, count=loop_metrics()[1]).install()
    if settings.log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(json_formatter())
    # no token, Authorization or cookie value in any line, whoever writes it (logscrub.py)
    logscrub.install(logging.getLogger().handlers)
    register_sensitive([os.environ.get("JUPYTERHUB_API_TOKEN")])
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    data_dir = Path(os.environ.get("GPULAB_DATA_DIR", "."))
    runtime = make_runtime(settings)
    runtime.log_gpus(log)
    if settings.check_gpu_runtime:
        try:
            refusal = await runtime.gpu_delivery_refusal()
        except EngineError as e:
            log.warning("could not ask the container engine which runtimes it has: %s", e)
            refusal = None
        if refusal:
            log.error("gpulab cannot hand out this host's GPUs: %s", refusal)
            sys.exit(2)
    await warn_of_address_pools(runtime, settings, config)
    # what reads the GPUs' activity (hang detection, the idle-GPU policy, pages, /metrics):
    # nothing to set up on one engine (NVML in this process); a Swarm's agent on each node
    await runtime.watch_gpus(settings.instance)
    try:
        database = Database(settings.database_url)
    except SchemaMismatch as e:  # an older schema waits for `gpulab admin upgrade-db`
        log.error("gpulab refuses to start: %s", e)
        sys.exit(2)
    supervisor = JobSupervisor(
        settings,
        database,
        runtime,
        data_dir / "job-logs",
    )
    await supervisor.start()
    notebooks = NotebookRecords(supervisor.records.db, settings.instance)
    devices = [d.key for d in supervisor.ledger.devices]
    REGISTRY.register(
        StateCollector(
            lambda: (
                supervisor.records.counts(runs=True),
                notebooks.counts(),
                supervisor.ledger.allocations(),
                devices,
            )
        )
    )
    REGISTRY.register(
        GpuUsageCollector(
            readings_from(asyncio.get_running_loop(), supervisor.ctx.gpu_readings),
            supervisor.ledger.allocations,
            devices,
        )
    )
    app = make_app(settings, supervisor)
    # what start-up made (modules, settings, the app, the supervisor) lives as long as the
    # process: out of the collector's sight, so that its full collections (which hold the GIL,
    # and so the event loop, whichever thread runs them) walk only what requests make; before
    # listening, so that no request waits for this one full collection
    settle_heap()
    # tornado stops reading a chunked body past this; below it (and for any declared body up
    # to 64 times the cap) the answer is a JSON 413 that names max_request_body (service/base.py)
    app.listen(
        url.port or 80,
        url.hostname or "127.0.0.1",
        max_body_size=body_backstop(settings.max_request_body),
    )
    log.info("gpulab service %s listening on %s", __version__, url.geturl())
    await asyncio.gather(
        watchdog_loop(settings, supervisor),
        idle_loop(settings, supervisor),
        retention_loop(settings, supervisor),
        checkpoint_loop(supervisor.records.db),
        live_push_loop(settings, supervisor, app.settings["notebook_pushes"]),
        follow_parent(),
        lag_loop(late=watch.late if watch else None),
    )


if __name__ == "__main__":
    # the hub stops its managed services with SIGINT: an ordinary end, not an error to log.
    # A hub started with SIGINT ignored (by a shell without job control: `hub &` in a script,
    # nohup) passes that on to this process, which then ignored the hub's SIGINT and was
    # killed 10 s later (meanwhile the hub's health check of the stopping service logged a
    # traceback): obey SIGINT whatever was inherited
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
