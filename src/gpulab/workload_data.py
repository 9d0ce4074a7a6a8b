"""Pull and push a workload's workspace and volumes with the sync helper container.

The hub (spawner) and the service (retries, jobs) share this: it resolves a store's credentials
(from the environment or a file named by the admin) and hands them to the short-lived helper
container only, runs ``gpulab-sync`` there against the workload's Docker volume, and turns the
helper's JSON lines into progress callbacks and a report.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .runtime.docker import DockerRuntime, run_helper
from .runtime.objects import L_INSTANCE, L_KIND, L_WORKLOAD, sync_helper_config
from .volumes import ObjectStore, VolumeSpec

log = logging.getLogger(__name__)

Progress = Callable[[dict], None]


class StorageCredentialsError(RuntimeError):
    """The admin's credentials for a store cannot be read (a platform fault: ERROR)."""


def store_credentials(store: ObjectStore) -> dict[str, str]:
    """Environment for the helper: the store's keys, read where the admin said they are."""
    if store.kind == "filesystem":
        return {}
    src = store.credentials
    if src.file:
        try:
            text = Path(src.file).read_text()
        except OSError as e:
            raise StorageCredentialsError(
                f"store {store.name}: cannot read its credentials file ({e.strerror})"
            ) from None
        values: dict[str, str] = {}
        for line in text.splitlines():
            if "=" in line and not line.lstrip().startswith(("#", "[")):
                k, v = line.split("=", 1)
                values[k.strip().upper()] = v.strip()
        key, secret = values.get("AWS_ACCESS_KEY_ID"), values.get("AWS_SECRET_ACCESS_KEY")
    else:
        key, secret = os.environ.get(src.access_key_env), os.environ.get(src.secret_key_env)
    if not key or not secret:
        where = src.file or f"${src.access_key_env} / ${src.secret_key_env}"
        raise StorageCredentialsError(f"store {store.name}: no credentials in {where}")
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}


@dataclass
class VolumeSync:
    """One volume of a workload: what it is, which Docker volume holds it, how it is shown."""

    spec: VolumeSpec
    docker_volume: str
    label: str  # "workspace" or the spec as the user wrote it

    def to_json(self) -> dict:
        return {"label": self.label, "spec": str(self.spec), "docker_volume": self.docker_volume}


def volume_name(container: str, spec: VolumeSpec, workspace: bool = False) -> str:
    if workspace:
        return f"{container}-workspace"
    return f"{container}-v-{hashlib.sha256(spec.mount.encode()).hexdigest()[:10]}"


@dataclass
class SyncOutcome:
    volume: VolumeSync
    ok: bool
    report: dict = field(default_factory=dict)
    reason: str = ""

    def summary(self) -> str:
        r = self.report
        if not self.ok:
            return f"{self.volume.label}: {self.reason}"
        moved = r.get("completed", 0)
        return (
            f"{self.volume.label}: {moved} transferred, {r.get('skipped', 0)} unchanged, "
            f"{r.get('deleted', 0)} deleted, {_size(r.get('bytes_transferred', 0))}"
        )


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def progress_message(verb: str, label: str, p: dict) -> str:
    total = p.get("objects_total", 0)
    return (
        f"{verb} {label}: {p.get('processed', 0)}/{total} objects "
        f"({p.get('completed', 0)} transferred, {p.get('skipped', 0)} unchanged, "
        f"{p.get('failed', 0)} failed), {_size(p.get('bytes_transferred', 0))}"
    )


class WorkloadData:
    def __init__(
        self,
        runtime: DockerRuntime,
        stores: dict[str, ObjectStore],
        image: str,
        instance: str,
        workload: str,
    ):
        self.runtime = runtime
        self.stores = stores
        self.image = image
        self.instance = instance
        self.workload = workload

    def _prepare_store(self, store: ObjectStore) -> None:
        """A filesystem store's directory exists and the helper (uid 1000) may write in it."""
        if store.kind != "filesystem" or not store.root:
            return
        root = Path(store.root)
        root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and root.stat().st_uid != 1000:
            os.chown(root, 1000, 100)

    def _remote_empty(self, vol: VolumeSync) -> bool:
        """True only when the store certainly holds nothing under the volume's prefix.

        Then a pull has nothing to do, and no helper container is started for it (a new
        workspace costs nothing). Any doubt (an error, an unreadable store) says False: the
        helper runs and reports properly.
        """
        spec, store = vol.spec, self.stores[vol.spec.store]
        prefix = spec.prefix.strip("/")
        if store.kind == "filesystem":
            top = Path(store.root or "/nonexistent") / spec.bucket / prefix
            if not top.exists():
                return True
            return top.is_dir() and not any(p.is_file() for p in top.rglob("*"))
        try:
            import boto3
            from botocore.config import Config

            env = store_credentials(store)
            client = boto3.client(
                "s3",
                endpoint_url=store.endpoint_url,
                region_name=store.region,
                aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                config=Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 1}),
            )
            answer = client.list_objects_v2(
                Bucket=spec.bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1
            )
            return answer.get("KeyCount", 0) == 0
        except Exception as e:
            # no bucket yet: nothing to pull (the push creates it); any other doubt: run the helper
            return type(e).__name__ == "NoSuchBucket"

    async def nothing_to_pull(self, vol: VolumeSync, image_provides_mount: bool = False) -> bool:
        """A pull can be skipped: the store holds nothing for the volume, and its Docker volume
        already exists (or the image's own directory at the mount will populate it), so it does
        not need the helper to create it owned by the workload's user."""
        if not (image_provides_mount or await self.runtime.volume_exists(vol.docker_volume)):
            return False
        return await self.runtime.run(self._remote_empty, vol)

    async def run(
        self, operation: str, vol: VolumeSync, on_progress: Progress | None = None
    ) -> SyncOutcome:
        """Run one ``gpulab-sync`` operation (pull, push, purge) for one volume."""
        store = self.stores[vol.spec.store]

        def prepare() -> dict[str, str]:
            env = store_credentials(store)  # may read the admin's credentials file
            self._prepare_store(store)
            return env

        try:
            env = await asyncio.to_thread(prepare)
        except (StorageCredentialsError, OSError) as e:
            return SyncOutcome(vol, False, reason=str(e))
        config = sync_helper_config(
            image=self.image,
            operation=operation,
            bucket=vol.spec.bucket,
            prefix=vol.spec.prefix,
            mode=vol.spec.mode,
            docker_volume=vol.docker_volume if operation != "purge" else None,
            store_kind=store.kind,
            store_root=store.root,
            endpoint_url=store.endpoint_url,
            region=store.region,
            labels={
                L_INSTANCE: self.instance,
                L_KIND: "sync-helper",
                L_WORKLOAD: self.workload,
            },
            environment=env,
        )
        final: dict = {}
        errors: list[str] = []

        def on_line(line: str) -> None:
            try:
                event = json.loads(line)
            except ValueError:
                if line.strip():
                    errors.append(line.strip())
                return
            if not isinstance(event, dict):
                return
            if event.get("event") == "report":
                final.update(event)
            elif event.get("event") == "progress" and on_progress:
                on_progress(event)

        try:
            result = await run_helper(self.runtime, config, on_line)
        except Exception as e:  # the engine refused or lost the helper
            return SyncOutcome(vol, False, reason=f"sync helper failed: {e}")
        if result.exit_code == 0 and final.get("ok", False):
            return SyncOutcome(vol, True, final)
        reason = _failure_reason(final, errors, result.exit_code)
        return SyncOutcome(vol, False, final, reason)


def _failure_reason(report: dict, errors: list[str], code: int) -> str:
    failures = report.get("failures") or []
    if failures:
        first = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        key = first.get("key") or "(listing)"
        return f"{key}: {first.get('reason', 'failed')}{more}"
    if errors:
        return errors[-1][:300]
    return f"gpulab-sync exited with code {code}"


def notebook_volumes(
    storage, container: str, user: str, server: str, workspace_dir: str, specs: list[str]
) -> list[VolumeSync]:
    """The workspace (when a workspace store is configured) and the user's volumes."""
    from .volumes import parse_volume

    out = []
    ws = storage.workspace_spec(user, server, workspace_dir)
    if ws is not None:
        out.append(VolumeSync(ws, volume_name(container, ws, workspace=True), "workspace"))
    for raw in specs:
        spec = parse_volume(raw, storage.stores, workspace=workspace_dir)
        out.append(VolumeSync(spec, volume_name(container, spec), str(spec)))
    return out


async def push_all(data: WorkloadData, volumes: list[VolumeSync]) -> list[SyncOutcome]:
    """Push every volume that pushes (rw, rwd); ro volumes are never pushed."""
    return [await data.run("push", v) for v in volumes if v.spec.pushes]


def push_verdict(outcomes: list[SyncOutcome]) -> tuple[bool, str]:
    failed = [o for o in outcomes if not o.ok]
    if failed:
        names = ", ".join(o.volume.label for o in failed)
        return False, (
            f"push of {names} failed: {'; '.join(o.summary() for o in failed)}. "
            "Nothing local was deleted; the next stop or a retry pushes again"
        )
    if not outcomes:
        return True, "compute released"
    return True, "compute released; pushed " + "; ".join(o.summary() for o in outcomes)
