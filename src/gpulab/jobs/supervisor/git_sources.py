"""Clone a job's git repositories (its ``git`` field) before the job starts.

Each repository is cloned at INITIALIZING by a short-lived helper container running
``gpulab-sync git-clone`` (:mod:`gpulab.datasync.gitclone`) in the sync image: never in the
user's image, never by the user's container, which does not exist yet. The helper mounts one
Docker volume per job and repository, ``<job container name>-git-<i>``, and nothing else; the
job's container mounts that volume read-write at the repository's ``path``
(:func:`git_mounts`). The clones are inputs: no sync pushes them anywhere (the workspace and
data volumes are other volumes), and they go when the job's volumes go
(:func:`git_volume_names`).

The credential, when the entry names one of the owner's secrets, is read through
``resolve_secret`` only here, just before its helper starts, and reaches that helper as its
secret files only (:attr:`HelperSpec.files`, which the backend delivers into the helper):
not its environment, not its command line, not the job's container, not any message. A secret
holding ``user:password`` is sent as those; any other value is a token, sent as the password
of user ``x-access-token`` (what GitHub and GitLab accept for tokens).

Network: the helper joins ``network_mode``, which the supervisor sets to the owner's own
network (their bridge on one engine, their overlay on a Swarm) when networks are per user: it
reaches what the job itself will reach (the internet, the owner's own workloads), not another
user's workloads, not the host's loopback services, and on a Swarm not the notebook gateway,
which listens on the manager's default bridge and leads to every user's notebooks and job
ports (the URL is the user's: a clone is a request to wherever it points). On a Swarm the
helper runs as a one-task service on the job's node
(the backend's ``run_helper``) with the same memory and process
limits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ...datasync.gitclone import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT,
    PASSWORD_FILE,
    USERNAME_FILE,
    scrub,
)
from ...disk_ledger import DiskQuotaExceeded
from ...disk_quota import GIT_DISK_FACTOR, clone_over, clone_refusal
from ...names import L_INSTANCE, L_KIND, L_WORKLOAD
from ...runtime.base import EngineError, HelperSpec, Mount
from ..spec import GitSource

if TYPE_CHECKING:
    from ...data.sync import WorkloadData

log = logging.getLogger(__name__)

#: the user a token is sent as (GitHub and GitLab accept any user name with a token)
TOKEN_USER = "x-access-token"
#: where the helper mounts the repository's volume (owned by uid 1000 in the sync image, so
#: a fresh volume takes that ownership and the job, uid 1000 too, can write its clone)
HELPER_DEST = "/data"
#: what one clone helper may use on the node: a repository's pack and its largest file are
#: held in memory by dulwich, a fork bomb is not a clone
HELPER_MEMORY = 4 * 1024**3
HELPER_PIDS = 256
#: a label telling clone helpers from the sync's (both are kind ``sync-helper``, so that the
#: recovery's sweep of a dead service's helpers removes them too: they hold a credential)
L_HELPER = "org.gpulab.helper"

Event = Callable[[str], None]


def git_volume_name(job_container_name: str, index: int) -> str:
    return f"{job_container_name}-git-{index}"


def git_volume_prefix(job_container_name: str) -> str:
    """What every git volume of the job starts with (for a sweep by prefix)."""
    return f"{job_container_name}-git-"


def git_volume_names(job_container_name: str, sources: Sequence[GitSource]) -> list[str]:
    """The job's git volumes, to remove with its other volumes."""
    return [git_volume_name(job_container_name, i) for i in range(len(sources))]


def git_mounts(job_container_name: str, sources: Sequence[GitSource]) -> list[Mount]:
    """The mounts that put each clone at its path in the job's container (read-write: the
    job may build, switch branches and commit there)."""
    return [
        Mount(git_volume_name(job_container_name, i), src.path, read_only=False)
        for i, src in enumerate(sources)
    ]


def credential_files(value: str) -> dict[str, bytes]:
    """The helper's secret files for a secret's value: ``user:password``, or a token."""
    value = value.strip()
    if not value:
        raise ValueError("the secret is empty")
    user, sep, password = value.partition(":")
    if not (sep and user and password):
        user, password = TOKEN_USER, value
    return {USERNAME_FILE: user.encode(), PASSWORD_FILE: password.encode()}


def clone_helper_spec(
    *,
    image: str,
    source: GitSource,
    volume: str,
    labels: dict[str, str],
    files: dict[str, bytes],
    network_mode: str = "bridge",
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
    user: str = "1000:100",
    quota_bytes: int | None = None,
) -> HelperSpec:
    """One clone helper, for any backend's ``run_helper`` (pure). Every user value travels as
    one ``--name=value`` argument: none can be read as another option."""
    command = [
        "git-clone",
        f"--url={source.url}",
        f"--dest={HELPER_DEST}",
        "--replace",
        f"--timeout={timeout:g}",
        f"--max-bytes={max_bytes}",
    ]
    if quota_bytes is not None:  # what the owner's disk quota booked for it
        command.append(f"--quota-bytes={quota_bytes}")
    if source.branch:
        command.append(f"--branch={source.branch}")
    elif source.revision:
        command.append(f"--revision={source.revision}")
    return HelperSpec(
        image=image,
        command=command,
        labels={**labels, L_HELPER: "git-clone"},
        user=user,
        files=files,
        mounts=(Mount(volume, HELPER_DEST),),
        network=network_mode,
        memory=HELPER_MEMORY,
        pids_limit=HELPER_PIDS,
    )


def _describe(src: GitSource) -> str:
    return f"{src.url} ({src.ref_text})"


async def clone_source(
    data: WorkloadData,
    job_container_name: str,
    node: str,
    index: int,
    source: GitSource,
    resolve_secret: Callable[[str], Awaitable[str]],
    *,
    network_mode: str = "bridge",
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[bool, str]:
    """Clone one repository into its volume on ``node``: (ok, message naming it)."""
    what = _describe(source)
    files: dict[str, bytes] = {}
    if source.secret:
        try:
            files = credential_files(await resolve_secret(source.secret))
        except LookupError:
            return False, (
                f"clone of {what} failed: your secret {source.secret!r} is gone (deleted since "
                "the job was submitted?)"
            )
        except Exception as e:  # the message of a decryption error names no value
            return False, (
                f"clone of {what} failed: your secret {source.secret!r} cannot be read "
                f"({type(e).__name__})"
            )
    secrets = [files[PASSWORD_FILE].decode()] if files else []
    volume = git_volume_name(job_container_name, index)
    disk = data.disk
    quota_bytes, quota, held = None, None, 0
    if disk is not None:  # a clone's size is known only once it arrived: book its bound
        max_bytes = disk.git_max_bytes or max_bytes
        owner, quota = await asyncio.to_thread(disk.owner_and_quota)
        try:
            check = await asyncio.to_thread(
                disk.ledger.book,
                owner,
                data.workload,
                volume,
                node,
                GIT_DISK_FACTOR * max_bytes,
                quota,
                kind="git",
                up_to=True,
            )
        except DiskQuotaExceeded as e:
            return False, clone_refusal(what, e.quota, e.check.held)
        held = check.held
        quota_bytes = check.granted if quota is not None else None
    helper = clone_helper_spec(
        image=data.image,
        source=source,
        volume=volume,
        labels={L_INSTANCE: data.instance, L_KIND: "sync-helper", L_WORKLOAD: data.workload},
        files=files,
        network_mode=network_mode,
        timeout=timeout,
        max_bytes=max_bytes,
        quota_bytes=quota_bytes,
    )
    result: dict = {}
    other: list[str] = []

    def on_line(line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            if line.strip():
                other.append(line.strip())
            return
        if isinstance(event, dict) and event.get("event") == "git":
            result.update(event)

    try:
        done = await data.runtime.run_helper(helper, on_line, node)
    except EngineError as e:  # the engine refused or lost the helper
        if disk is not None:
            await asyncio.to_thread(disk.ledger.release, volume, node)
        return (
            False,
            f"clone of {what} failed: the clone helper did not run: {scrub(str(e), secrets)}",
        )
    ok = done.exit_code == 0 and bool(result.get("ok"))
    if disk is not None:  # what it took; a failed clone left its volume empty
        taken = int(result.get("disk_bytes") or 0) if ok else 0
        await asyncio.to_thread(disk.ledger.settle, volume, node, taken)
    if ok:
        commit = str(result.get("commit", ""))[:12]
        kept = " (kept from an earlier start of this job)" if result.get("kept") else ""
        return True, f"cloned {what} at {commit} into {source.path}{kept}"
    if result.get("limit") == "quota" and quota is not None and quota_bytes is not None:
        return False, clone_over(what, quota_bytes, quota, held)
    if result.get("reason"):
        reason = str(result["reason"])
    elif done.exit_code == 137:
        reason = "the clone helper was killed (out of memory?)"
    elif other:
        reason = other[-1][:300]
    else:
        reason = f"the clone helper exited with code {done.exit_code}"
    return False, f"clone of {what} failed: {scrub(reason, secrets)}"


async def clone_sources(
    data: WorkloadData,
    job_container_name: str,
    node: str,
    sources: Sequence[GitSource],
    resolve_secret: Callable[[str], Awaitable[str]],
    on_event: Event | None = None,
    *,
    network_mode: str = "bridge",
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[bool, str]:
    """Clone every repository of the job, one after another, stopping at the first failure:
    (True, "cloned ...; cloned ...") or (False, "clone of URL (branch B) failed: why").
    ``on_event`` gets each repository's message as it is done (the job's events)."""
    done: list[str] = []
    for i, src in enumerate(sources):
        ok, message = await clone_source(
            data,
            job_container_name,
            node,
            i,
            src,
            resolve_secret,
            network_mode=network_mode,
            timeout=timeout,
            max_bytes=max_bytes,
        )
        if on_event is not None:
            on_event(message)
        if not ok:
            log.info("%s: %s", job_container_name, message)
            return False, message
        done.append(message)
    return True, "; ".join(done) if done else "no git repositories"
