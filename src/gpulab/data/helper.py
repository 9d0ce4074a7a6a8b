"""What the sync helper is told (pure): its command line, its mounts, the store's directories.

The helper is a short-lived container of the ``gpulab-sync`` image (:mod:`gpulab.datasync`)
that pulls or pushes one volume of a workload; :mod:`gpulab.data.sync` runs it through the
``Runtime``. What it runs and mounts (a backend-neutral ``HelperSpec``) is built here, from
plain values, and tested as data.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..datasync.filesystem import META_DIR
from ..runtime.base import HelperSpec, Mount


def filesystem_store_dirs(bucket: str, prefix: str) -> tuple[str, str]:
    """The two directories of a filesystem store (relative to its root) that a volume on
    ``bucket``/``prefix`` may touch: its objects and their sidecar metadata. An empty prefix
    (a grant on the whole bucket) gives the bucket's directories."""
    trimmed = prefix.strip("/")
    parts = trimmed.split("/") if trimmed else []
    if (
        not bucket
        or "/" in bucket
        or bucket.startswith(".")
        or any(p in ("", ".", "..") or "\x00" in p for p in [bucket, *parts])
    ):
        raise ValueError(f"unsafe store location {bucket!r}/{prefix!r}")
    rel = "/".join([bucket, *parts])
    return rel, f"{META_DIR}/{rel}"


def sync_helper_spec(
    *,
    image: str,
    operation: str,
    bucket: str,
    prefix: str,
    mode: str,
    docker_volume: str | None,
    store_kind: str,
    store_root: str | None,
    endpoint_url: str | None,
    region: str,
    labels: dict[str, str],
    environment: dict[str, str],
    user: str = "1000:100",
    mirror: bool = False,
    max_bytes: int | None = None,
    files: dict[str, bytes] | None = None,
    store_args: list[str] | None = None,
    exclude: Sequence[str] = (),
    cap: int | None = None,
    live: bool = False,
    settle_s: float | None = None,
    wait_lock_s: float = 0.0,
    links: bool = False,
) -> HelperSpec:
    """A short-lived ``gpulab-sync`` helper, for any backend's ``run_helper``.

    ``files`` and ``store_args``: the store's secret files (its keys, its CA bundle) and the
    arguments that name them where the helper finds them
    (:func:`gpulab.data.sync.helper_store_files`): secrets travel as files, never in the
    helper's environment or command line.

    ``max_bytes``: a pull refuses a prefix whose objects weigh more than this together (what
    the owner's disk quota booked for the volume: :mod:`gpulab.disk_ledger`). ``cap``: a push
    refuses a volume whose files weigh more than this (a home's cap), sending nothing.

    ``exclude``: paths a pull or a push leaves alone (``--exclude``, one per pattern:
    :mod:`gpulab.datasync.exclude`). ``links``: symbolic links are kept as links
    (``--links``: a home's venvs and conda environments; never followed).

    ``mirror``: a pull also removes local files whose object was deleted since the volume's
    last sync (``--delete``; files changed locally are kept), for a volume that may be an older
    copy (a cluster node the workload left and came back to).

    ``live``: a push while the workload runs (``--live``: settled files only, no deletion;
    the rule is :mod:`gpulab.datasync.live`), taking files unchanged for ``settle_s`` seconds
    (None: the helper's 10). ``wait_lock_s``: how long a pull or a push waits for
    another sync of the volume to end (the final push waits for a live push; so does a pull,
    for one that started as the workload stopped).

    The helper mounts the workload's volume at /data. For the embedded filesystem store it
    sees only what that volume may touch, never the store root: the volume's own directory
    ``<store_root>/<bucket>/<prefix>`` and its metadata directory
    ``<store_root>/.gpulab-meta/<bucket>/<prefix>`` (:func:`filesystem_store_dirs`), each
    bound at the same path under /store so that ``file:///store`` works unchanged. They are
    read-only unless the operation writes the store (a push of an rw/rwd volume, a purge).
    ``store_root`` must be the canonical path whose directories the caller has checked (see
    :func:`gpulab.data.sync.prepare_store_dirs`). The helper uses the host's
    network so that it reaches the same endpoints as the hub (a loopback endpoint included).
    It never runs user code.
    """
    command = [operation, "--bucket", bucket, "--prefix", prefix, "--json-progress"]
    mounts: list[Mount] = []
    host_dirs: dict[str, tuple[str, bool]] = {}
    if operation != "purge":
        command += ["--local", "/data", "--mode", mode]
        if mirror and operation == "pull":
            command.append("--delete")
        if max_bytes is not None and operation == "pull":
            command += ["--max-bytes", str(int(max_bytes))]
        if cap is not None and operation == "push":
            command += ["--max-bytes", str(int(cap))]
        for pattern in exclude:
            command += ["--exclude", pattern]
        if links:
            command.append("--links")
        if live and operation == "push":
            command.append("--live")
            if settle_s is not None:
                command += ["--settle-seconds", f"{settle_s:g}"]
        if wait_lock_s > 0:
            command += ["--wait-lock", f"{wait_lock_s:g}"]
        if docker_volume is None:
            raise ValueError("pull and push need a volume")
        mounts.append(Mount(docker_volume, "/data"))
    if store_kind == "filesystem":
        if not store_root:
            raise ValueError("a filesystem store needs its root")
        command += ["--store-endpoint", "file:///store"]
        writes = operation == "purge" or (operation == "push" and mode in ("rw", "rwd"))
        for rel in filesystem_store_dirs(bucket, prefix):
            host = f"{store_root.rstrip('/')}/{rel}"
            host_dirs[host] = (f"/store/{rel}", not writes)
    else:
        if endpoint_url:
            command += ["--store-endpoint", endpoint_url]
        command += ["--region", region, *(store_args or [])]
    return HelperSpec(
        image=image,
        command=command,
        labels=labels,
        env=environment,
        user=user,
        mounts=tuple(mounts),
        host_dirs=host_dirs,
        network="host",
        files=dict(files or {}),
    )
