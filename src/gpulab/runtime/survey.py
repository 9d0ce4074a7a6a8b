"""What an engine says about itself, for ``gpulab doctor``: ``docker info`` (version, runtimes,
default address pools), its networks and the labels of the images asked about. Gathering only:
what it means is :mod:`gpulab.doctor.checks`' to judge."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..names import L_INSTANCE
from .base import EngineError, EngineNetwork, EngineSurvey
from .engine import EngineClient

#: where a local engine's configuration lives (``default-address-pools``)
DAEMON_JSON = Path("/etc/docker/daemon.json")


def pools_of(entries) -> tuple[tuple[str, int], ...]:
    """``[{"Base": "10.201.0.0/16", "Size": 24}]`` (docker info's and daemon.json's spelling
    alike, any case) as ``(("10.201.0.0/16", 24),)``; entries without both are left out."""
    out = []
    for entry in entries or ():
        if not isinstance(entry, Mapping):
            continue
        low = {str(k).lower(): v for k, v in entry.items()}
        try:
            out.append((str(low["base"]), int(low["size"])))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)


def daemon_json_pools(path: Path = DAEMON_JSON) -> tuple[tuple[str, int], ...] | None:
    """The ``default-address-pools`` of a local engine's daemon.json; None when the file or
    the setting is absent or unreadable."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pools = config.get("default-address-pools") if isinstance(config, dict) else None
    return pools_of(pools) or None


def engine_address(base_url: str) -> str:
    """Where the engine was asked, as DOCKER_HOST writes it (the SDK names a socket
    ``http+docker://localhost``)."""
    if base_url.startswith("http+docker://"):
        return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    return base_url


def _network(net: Mapping, instance: str) -> EngineNetwork:
    ipam = (net.get("IPAM") or {}).get("Config") or []
    subnets = tuple(str(c["Subnet"]) for c in ipam if isinstance(c, Mapping) and c.get("Subnet"))
    labels = net.get("Labels") or {}
    return EngineNetwork(
        name=str(net.get("Name", "")),
        subnets=subnets,
        ours=bool(instance) and labels.get(L_INSTANCE) == instance,
    )


async def survey_engine(
    engine: EngineClient, images: Mapping[str, str], instance: str, local: bool = True
) -> EngineSurvey:
    """Ask ``engine`` (``images``: the name asked about -> the name the engine knows it by).
    ``local``: the engine runs on this host, so its daemon.json may be read for the pools."""
    address = engine_address("http+docker://")  # where an engine made from the environment is
    try:
        client = engine.client
        address = engine_address(str(getattr(client, "base_url", "")))
        info = await engine.call(client.info)
    except EngineError as e:
        return EngineSurvey(address=address, error=str(e) or type(e).__name__)
    pools: tuple[tuple[str, int], ...] | None = pools_of(info.get("DefaultAddressPools")) or None
    pools_from = "docker info" if pools else ""
    if pools is None and local:
        pools = daemon_json_pools()
        pools_from = str(DAEMON_JSON) if pools else ""
    try:
        networks = tuple(_network(n, instance) for n in await engine.call(client.networks))
        labels: dict[str, dict[str, str] | None] = {}
        for name, ref in images.items():
            labels[name] = await _labels(engine, ref)
    except EngineError as e:
        return EngineSurvey(address=address, error=str(e) or type(e).__name__)
    return EngineSurvey(
        address=address,
        version=str(info.get("ServerVersion") or ""),
        runtimes=dict(info.get("Runtimes") or {}),
        default_runtime=str(info.get("DefaultRuntime") or ""),
        address_pools=pools,
        pools_from=pools_from,
        networks=networks,
        images=labels,
    )


async def _labels(engine: EngineClient, ref: str) -> dict[str, str] | None:
    try:
        found = await engine.call(engine.client.inspect_image, ref)
    except EngineError as e:
        if e.not_found:
            return None
        raise
    return dict((found.get("Config") or {}).get("Labels") or {})


def refs(image_ref, images: Sequence[str]) -> dict[str, str]:
    """Each image -> the name the engine runs it by (``Runtime.image_ref``)."""
    return {image: image_ref(image) for image in images}
