"""What ``gpulab doctor`` reads of the host, as the hub and the service would: the site
configuration (the hub's jupyterhub_config.py), NVML, the container engine (through the
:class:`~gpulab.runtime.base.Runtime` that ``make_runtime`` chooses, ``Runtime.survey``), the
object stores with the hub's credentials, the database and the proxy's binary. I/O only: what
it means is :mod:`.checks`' to say. No credential leaves this module: a store's keys are read to
sign one listing, and every message a store or a connection returns is scrubbed of them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from traitlets.config import Config

from ..data.sync import StorageCredentialsError, store_credentials, store_remote
from ..db import expected_schema, head_revision, read_schema, schema_revision, shown_url
from ..gpus.inventory import discover_nvml, from_config
from ..runtime import make_runtime, users_counted
from ..settings import GpulabSettings, load_config
from ..volumes import ObjectStore
from .checks import (
    BucketProbe,
    DatabaseFacts,
    Facts,
    ImageNeed,
    ProxyFacts,
    StoreFacts,
)

#: the proxy JupyterHub starts when its configuration names none
DEFAULT_PROXY = "configurable-http-proxy"


class ConfigUnreadable(Exception):
    """The site configuration cannot be read or is refused; the message says why."""


def config_path(given: str | None) -> str:
    """The hub's configuration file: ``--config``, else ``$GPULAB_CONFIG_FILE`` (what the hub
    hands its service), else ``jupyterhub_config.py`` in this directory."""
    path = given or os.environ.get("GPULAB_CONFIG_FILE") or "jupyterhub_config.py"
    if not Path(path).is_file():
        raise ConfigUnreadable(f"no file {path}")
    return str(Path(path).resolve())


def read_settings(path: str) -> tuple[GpulabSettings, Config]:
    """The settings the hub and its service read from ``path`` (``settings.load_config``)."""
    try:
        config = load_config(path)
        settings = GpulabSettings(config=config)
        settings.storage  # noqa: B018 (the stores' configuration is checked when first read)
        settings.catalog  # noqa: B018
    except SystemExit as e:  # the file refuses, as it would refuse the hub's start
        raise ConfigUnreadable(str(e.code)) from None
    except Exception as e:  # the file is Python: anything may go wrong in it
        raise ConfigUnreadable(f"{type(e).__name__}: {e}") from None
    return settings, config


def image_needs(settings: GpulabSettings) -> tuple[ImageNeed, ...]:
    """Every image the configuration names: the catalog's, the allowed ones, the sync helper."""
    needs: dict[str, ImageNeed] = {}
    for fw in settings.catalog.frameworks.values():
        for v in fw.versions:
            needs.setdefault(v.image, ImageNeed(v.image, "framework", f"{fw.id} {v.id}"))
    for image in settings.allowed_images:
        needs.setdefault(image, ImageNeed(image, "allowed", "allowed_images"))
    needs.setdefault(settings.sync_image, ImageNeed(settings.sync_image, "sync", "sync helper"))
    return tuple(needs.values())


def proxy_facts(config: Config) -> ProxyFacts:
    section = config.ConfigurableHTTPProxy if "ConfigurableHTTPProxy" in config else {}
    command = section.get("command") or [DEFAULT_PROXY]
    first = command if isinstance(command, str) else str(list(command)[0])
    started = bool(section.get("should_start", True))
    if "/" in first:
        path = first if os.access(first, os.X_OK) and Path(first).is_file() else ""
    else:
        path = shutil.which(first) or ""
    return ProxyFacts(command=first, path=path, started_by_hub=started)


def database_facts(url: str) -> DatabaseFacts:
    shown = shown_url(url)
    try:
        tables = read_schema(url)
        revision = schema_revision(url) if tables else None
    except Exception as e:
        return DatabaseFacts(shown, error=_first_line(e), expected=expected_schema())
    return DatabaseFacts(
        shown, tables=tables, expected=expected_schema(), revision=revision, head=head_revision()
    )


# --- stores ---------------------------------------------------------------------------------


def _credentials_from(store: ObjectStore) -> str:
    src = store.credentials
    return f"the file {src.file}" if src.file else f"${src.access_key_env} / ${src.secret_key_env}"


def _root_state(root: str) -> str:
    path = Path(root)
    if path.exists():
        if not path.is_dir():
            return "not a directory"
        return "writable" if os.access(path, os.W_OK | os.X_OK) else "not writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return "missing" if os.access(parent, os.W_OK | os.X_OK) else "not writable"


def _buckets(settings: GpulabSettings, name: str) -> list[tuple[str, str, bool]]:
    """(bucket, what it is for, only read) of each bucket the configuration names in store
    ``name``."""
    storage = settings.storage
    found: dict[str, tuple[str, bool]] = {}
    if storage.workspace is not None and storage.workspace.store == name:
        found[storage.workspace.bucket] = ("workspaces", False)
    for g in storage.grants:
        if g.store != name:
            continue
        read_only = g.modes <= {"ro"}
        purpose, was_read_only = found.get(g.bucket, ("volume grant", True))
        found[g.bucket] = (purpose, was_read_only and read_only)
    return [(b, p, ro) for b, (p, ro) in found.items()]


def _scrub(text: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _probe(client, bucket: str, purpose: str, read_only: bool, secrets) -> BucketProbe:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if bucket:
            client.list_objects_v2(Bucket=bucket, MaxKeys=1)
        else:
            client.list_buckets()
    except ClientError as e:
        error = e.response.get("Error", {})
        code = str(
            error.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        )
        message = _scrub(str(error.get("Message") or ""), secrets)
        return BucketProbe(bucket, purpose, read_only, code=code, message=message)
    except BotoCoreError as e:
        return BucketProbe(
            bucket, purpose, read_only, "unreachable", _scrub(_first_line(e), secrets)
        )
    return BucketProbe(bucket, purpose, read_only)


def store_facts(settings: GpulabSettings, store: ObjectStore) -> StoreFacts:
    if store.kind == "filesystem":
        root = store.root or ""
        return StoreFacts(store.name, store.kind, where=root, root_state=_root_state(root))
    where = store.endpoint_url or f"AWS ({store.region})"
    creds = _credentials_from(store)
    try:
        env = store_credentials(store)
    except StorageCredentialsError as e:
        return StoreFacts(store.name, store.kind, where, creds, credentials_error=str(e))
    from ..datasync.s3_settings import S3Settings

    secrets = tuple(env.values())
    quick = S3Settings(max_attempts=2, connect_timeout=5.0, read_timeout=20.0)
    client = store_remote(store, "", quick).client
    buckets = _buckets(settings, store.name) or [("", "the store", False)]
    probes = tuple(_probe(client, b, p, ro, secrets) for b, p, ro in buckets)
    return StoreFacts(store.name, store.kind, where, creds, probes=probes)


# --- all of it ------------------------------------------------------------------------------


def gather(settings: GpulabSettings, config: Config, path: str, users: int | None = None) -> Facts:
    try:
        configured = tuple(from_config(settings.gpu_devices))
        runtime = make_runtime(settings)
    except ValueError as e:
        raise ConfigUnreadable(str(e)) from None
    needs = image_needs(settings)
    survey = asyncio.run(runtime.survey([n.image for n in needs], settings.instance))
    needed, needed_from = users_counted(config, users)
    return Facts(
        config=path,
        gpu_mode=settings.gpu_mode,
        check_gpu_runtime=settings.check_gpu_runtime,
        network_isolation=settings.network_isolation,
        clustered=runtime.clustered,
        configured_gpus=configured,
        discover_gpus=settings.discover_gpus,
        nvml=discover_nvml(),
        engine=survey,
        images=needs,
        stores=tuple(store_facts(settings, s) for s in settings.storage.stores.values()),
        users_needed=needed,
        users_from=needed_from,
        database=database_facts(settings.database_url),
        proxy=proxy_facts(config),
    )
