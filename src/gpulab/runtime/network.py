"""Per-user networks: one user's containers cannot open connections to another user's.

Every notebook and job of a user joins one user-defined bridge network,
``<instance>-net-<user>``, and no other (not Docker's default bridge). Docker isolates
user-defined bridges from each other and from the default bridge (its DOCKER-ISOLATION
iptables chains drop forwarded traffic between two bridges), so a connection from one user's
container to another user's container IP times out, while a user's own notebook and jobs can
still talk to each other (a job serving a model that the notebook queries, TensorBoard...).
Addresses of the host stay reachable (they are not forwarded traffic): notebooks reach the hub
API on the docker0 gateway, and the proxy on the host reaches every notebook's IP.

Why one network per user rather than one per workload or one shared network with
inter-container traffic disabled (``enable_icc=false``): a user's own workloads working
together is what people expect from "my notebooks and my jobs", and a network per workload
would spend the engine's address pools several times faster. The cost is that each user with a
container holds one network, and Docker's built-in address pools hold 31 bridge networks:
operators with more concurrent users configure ``default-address-pools`` (``pools.py``; the
service warns at start-up when the pools are short, docs/scale-out.md#address-pools).
Networks are therefore removed (best effort) when a user's last gpulab container is gone.

The network is created on demand by whichever process needs it first (the hub's spawner or
the service's job supervisor). Creation is create-or-get by name; engines before 23.0 can
create two networks of the same name when two processes race, so every caller then keeps the
one with the lowest ID and removes the others, and all callers agree on which one stays
(measured on Engine 20.10: eight concurrent creates of one name made eight networks). Workloads
join by network ID, which stays unambiguous while a duplicate still exists.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from docker.errors import APIError, NotFound

from .. import __version__
from ..names import (
    L_INSTANCE,
    L_JOB,
    L_KIND,
    L_USER,
    L_VERSION,
    job_network_name,
    user_network_name,
)
from .base import NetworkUnavailable
from .pools import POOLS_EXAMPLE, pools_exhausted

log = logging.getLogger(__name__)

NETWORK_KIND = "network"
MODES = ("user", "none")


#: a user's overlay on a Swarm is named and labelled apart from their bridge on the manager's
#: own engine (notebooks there): neither is mistaken for a duplicate of the other
OVERLAY_KIND = "overlay-network"


def network_labels(instance: str, user: str, driver: str = "bridge") -> dict[str, str]:
    kind = OVERLAY_KIND if driver == "overlay" else NETWORK_KIND
    return {L_INSTANCE: instance, L_KIND: kind, L_USER: user, L_VERSION: __version__}


def _overlay(driver: str, encrypted: bool) -> dict:
    """What an overlay adds: attachable (the notebook gateway and helpers join it), and its
    VXLAN traffic between nodes encrypted (IPsec) unless the operator turned that off."""
    if driver != "overlay":
        return {}
    return {"attachable": True, **({"options": {"encrypted": ""}} if encrypted else {})}


def user_network_config(
    instance: str, user: str, driver: str = "bridge", encrypted: bool = False
) -> dict:
    """Keyword arguments for ``APIClient.create_network`` of a user's network: a bridge on one
    engine, an overlay across a Swarm (attachable, so that the hub's proxy can join it;
    ``encrypted``: its traffic between nodes is)."""
    overlay = _overlay(driver, encrypted)
    return {
        "name": user_network_name(instance, user, driver),
        "driver": driver,
        **overlay,
        # not internal: workloads may reach the outside and the hub API on the host
        "internal": False,
        "labels": network_labels(instance, user, driver),
        # the engine's best-effort duplicate check (ensure_user_network handles the rest)
        "check_duplicate": True,
    }


#: a distributed job's own network (its workers only): kind and name apart from users'
JOB_NETWORK_KIND = "job-network"


def job_network_config(
    instance: str, owner: str, job_id: str, driver: str = "bridge", encrypted: bool = False
) -> dict:
    """A distributed job's network: its workers reach each other there by rank name, and no
    other job's or user's workload is on it. Not internal (workers may reach the outside, as
    any job); on a Swarm an attachable overlay (the gateway joins it for the job's ports)."""
    overlay = _overlay(driver, encrypted)
    return {
        "name": job_network_name(instance, job_id, driver),
        "driver": driver,
        **overlay,
        "internal": False,
        "labels": {
            L_INSTANCE: instance,
            L_KIND: JOB_NETWORK_KIND,
            L_USER: owner,
            L_JOB: job_id,
            L_VERSION: __version__,
        },
        "check_duplicate": True,
    }


def ensure_job_network(
    client, instance: str, owner: str, job_id: str, driver: str = "bridge", encrypted: bool = False
) -> str:
    """Create-or-get a distributed job's network (blocking); the ID of the one to join."""
    config = job_network_config(instance, owner, job_id, driver, encrypted)
    with _lock_for(config["name"]):
        return _ensure(client, instance, config)


def prune_job_networks(
    client, instance: str, in_use=None, driver: str = "bridge", job_id: str = ""
) -> list[str]:
    """Remove the networks of distributed jobs (of ``job_id`` only, if given) that have no
    workload left (blocking): the job ids whose network went."""
    in_use = in_use or _has_containers
    labels = [f"{L_INSTANCE}={instance}", f"{L_KIND}={JOB_NETWORK_KIND}"]
    nets = client.networks(filters={"label": labels + ([f"{L_JOB}={job_id}"] if job_id else [])})
    gone = []
    for n in nets:
        job_id = (n.get("Labels") or {}).get(L_JOB)
        if not job_id or n.get("Driver") not in (None, driver):
            continue
        if in_use(client, [f"{L_INSTANCE}={instance}", f"{L_JOB}={job_id}"], n["Id"]):
            continue
        try:
            client.remove_network(n["Id"])
            gone.append(job_id)
        except NotFound:
            pass
        except APIError as e:  # a worker joined it meanwhile (a restart): next time
            log.info("network of job %s kept: %s", job_id, e.explanation or e)
        with _locks_guard:
            _locks.pop(n.get("Name", ""), None)
    return gone


def remove_job_network(client, instance: str, job_id: str) -> None:
    """A distributed job ended: its network goes (blocking). The engine lets a network go once
    no running container is on it; the stopped workers keep a stale reference, which nothing
    uses (a resumed job's workers are made anew, with a new network). The engine's bridge
    pool is small (about 30): one per running gang, none per ended one."""
    for name in (job_network_name(instance, job_id),):
        for n in _named(client, name):
            if (n.get("Labels") or {}).get(L_INSTANCE) != instance:
                continue
            info = client.inspect_network(n["Id"])
            for container in info.get("Containers") or {}:
                with contextlib.suppress(APIError):
                    client.disconnect_container_from_network(container, n["Id"], force=True)
    prune_job_networks(client, instance, lambda *_: False, "bridge", job_id)


def network_for(mode: str, instance: str, user: str) -> str | None:
    """The network a user's workloads join: their own, or None for the engine's default."""
    if mode == "user":
        return user_network_name(instance, user)
    if mode == "none":
        return None
    raise ValueError(f"unknown network isolation mode {mode!r}; use one of {', '.join(MODES)}")


def explain_create_error(name: str, explanation: str) -> str:
    """What a user (and the operator reading the logs) is told when a network cannot be made:
    for used-up address pools (``pools.pools_exhausted``: each engine's words for it), the
    cause and the operator's fix, the engine's own words last."""
    if pools_exhausted(explanation):
        return (
            f"no network could be created for your workloads ({name}): the container engine's "
            "address pools are used up (each user with a notebook or a job holds one network). "
            "Ask the operator to give Docker more, smaller pools: default-address-pools in "
            f"/etc/docker/daemon.json, for example {POOLS_EXAMPLE} (256 networks), then restart "
            "dockerd (docs/scale-out.md#address-pools); or stop some workloads and try again. "
            "Engine said: " + explanation
        )
    return f"no network could be created for your workloads ({name}): {explanation}"


def is_missing_network(error: Exception) -> bool:
    """True for the engine's answer to a container whose network was removed meanwhile: a
    create's 404, or a start's 500 ("Could not attach to network ...: network ... not
    found": a container created on a network ID that went before its start)."""
    if not isinstance(error, APIError):
        return False
    text = str(error.explanation or error)
    if error.status_code == 404:
        return "network" in text
    return error.status_code == 500 and "attach to network" in text and "not found" in text


def _named(client, name: str) -> list[dict]:
    # the engine's name filter matches substrings: keep exact matches only
    return [n for n in client.networks(names=[name]) if n.get("Name") == name]


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


#: seconds the ID of a user's network that this process found or made is given again to a
#: caller that may reuse it (``reuse``) without asking the engine: 16 jobs of one user
#: starting at once each listed the engine's networks in turn, under the network's lock
KNOWN_FOR = 10.0
#: (engine client, network name) -> (its ID, time.monotonic() when found)
_known: dict[tuple[int, str], tuple[str, float]] = {}


def _known_key(client, name: str) -> tuple[int, str]:
    # the client object, not its URL: every local socket's is http+docker://localhost
    return (id(client), name)


def ensure_user_network(
    client,
    instance: str,
    user: str,
    driver: str = "bridge",
    encrypted: bool = False,
    reuse: bool = False,
) -> str:
    """Create-or-get the user's network (blocking); returns the ID of the one to join.

    Safe against other threads and processes doing the same at the same time, and against a
    prune that removes the network between our look-up and our create (we look again).
    Containers join by ID, not by name: while a duplicate made by a racing process still
    exists (or is kept because a container joined it), the name is ambiguous to the engine.
    ``reuse``: an ID this process found within :data:`KNOWN_FOR` seconds will do (for a
    caller that asks again, after :func:`forget_user_network`, when the engine says that
    network is gone: :func:`is_missing_network`).
    """
    config = user_network_config(instance, user, driver, encrypted)
    key = _known_key(client, config["name"])
    with _lock_for(config["name"]):  # threads of one process: one create; others: below
        known = _known.get(key)
        if reuse and known is not None and time.monotonic() - known[1] < KNOWN_FOR:
            return known[0]
        found = _ensure(client, instance, config)
        _known[key] = (found, time.monotonic())
        return found


def forget_user_network(client, instance: str, user: str, driver: str = "bridge") -> None:
    """The ID this process knows of the user's network is not to be given again (the engine
    said it is gone, or this process removed it)."""
    _known.pop(_known_key(client, user_network_name(instance, user, driver)), None)


#: overlays found unencrypted where encryption is wanted (warned about once per process)
_plain_seen: set[str] = set()


def _ensure(client, instance: str, config: dict) -> str:
    name = config["name"]
    for _ in range(3):
        found = _named(client, name)
        if not found:
            try:
                client.create_network(**config)
            except APIError as e:
                text = str(e.explanation or e)
                if e.status_code != 409 and "already exists" not in text:
                    raise NetworkUnavailable(explain_create_error(name, text)) from None
            found = _named(client, name)
        if not found:
            continue  # removed by a concurrent prune right after: try again
        foreign = [n for n in found if (n.get("Labels") or {}).get(L_INSTANCE) != instance]
        if foreign:
            raise NetworkUnavailable(
                f"a network named {name} exists but was not created by this gpulab "
                "installation; the operator must remove or rename it"
            )
        # every racer keeps the lowest ID it sees: the lowest of all is never removed, and
        # each other one is removed by its own creator or by the lowest one's
        keep, *extra = sorted(found, key=lambda n: n["Id"])
        for n in extra:
            with contextlib.suppress(APIError):  # in use: it goes with its last container
                client.remove_network(n["Id"])
        if extra:
            log.info("network %s was created %d times at once", name, len(found))
        wanted = (config.get("options") or {}).get("encrypted") is not None
        if wanted and "encrypted" not in (keep.get("Options") or {}) and name not in _plain_seen:
            _plain_seen.add(name)  # (an overlay's options cannot change: it goes when unused)
            log.warning(
                "overlay %s was made without encryption (before swarm_overlay_encryption): "
                "its traffic between nodes stays in clear until its last workload is gone and "
                "it is made again",
                name,
            )
        return keep["Id"]
    raise NetworkUnavailable(f"the network {name} kept disappearing while it was being created")


def _has_containers(client, labels: list[str], network_id: str = "") -> bool:
    return bool(client.containers(all=True, filters={"label": labels}))


def remove_user_network_if_unused(
    client, instance: str, user: str, in_use=_has_containers, driver: str = "bridge"
) -> bool:
    """Remove the user's network once they have no gpulab container left (blocking).

    Best effort: returns False when it is kept (a container still exists, running or not: an
    exited job container restarted in place needs the very same network) or when the engine
    refuses (in use meanwhile). Never raises for those.
    """
    name = user_network_name(instance, user, driver)
    labels = [f"{L_INSTANCE}={instance}", f"{L_USER}={user}"]
    if in_use(client, labels):
        return False
    removed = False
    for n in _named(client, name):
        if (n.get("Labels") or {}).get(L_INSTANCE) != instance:
            continue
        forget_user_network(client, instance, user, driver)
        try:
            client.remove_network(n["Id"])
            removed = True
        except NotFound:
            pass
        except APIError as e:  # e.g. "has active endpoints": a workload joined it meanwhile
            log.info("network %s kept: %s", name, e.explanation or e)
    return removed


def prune_user_networks(
    client, instance: str, in_use=_has_containers, driver: str = "bridge"
) -> list[str]:
    """Remove every network of this installation whose user has no workload (blocking)."""
    kind = OVERLAY_KIND if driver == "overlay" else NETWORK_KIND
    nets = client.networks(filters={"label": [f"{L_INSTANCE}={instance}", f"{L_KIND}={kind}"]})
    users = {(n.get("Labels") or {}).get(L_USER) for n in nets} - {None}
    return [
        u
        for u in sorted(users)
        if remove_user_network_if_unused(client, instance, u, in_use, driver)
    ]
