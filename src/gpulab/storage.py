"""Which object storage a workload uses: stores, grants, workspaces, user volumes (pure).

Built once from the admin's configuration; used by the option validation (what a user may
attach) and by the sync orchestration (what to pull and push).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .volumes import (
    CredentialsSource,
    Grant,
    ObjectStore,
    VolumeError,
    VolumeSpec,
    WorkspaceLocation,
    access_pattern,
    check_access,
    parse_volumes,
    validate_bucket_name,
)

DEFAULT_SERVER_KEY = "_default"

#: the part of a user's workspace prefix under which their notebooks' homes are kept:
#: ``<root>/<user>/.home/<server>`` (inside what is the user's alone, beside their workspaces)
HOME_KEY = ".home"

#: caches and logs a home keeps out of object storage by default (``home_exclude``; the
#: rules: :mod:`gpulab.datasync.exclude`): they cost storage and come back by themselves
DEFAULT_HOME_EXCLUDE: tuple[str, ...] = (
    ".cache/",  # XDG caches: pip's wheels and HTTP cache, matplotlib's fonts, huggingface's
    "__pycache__/",  # Python's bytecode, at any depth
    ".npm/_cacache/",
    ".conda/pkgs/",  # conda's package cache (its environments, .conda/envs, are kept)
    ".local/share/Trash/",
    ".local/share/jupyter/runtime/",  # a running server's and kernels' connection files
    ".local/share/code-server/logs/",
    ".local/share/code-server/coder-logs/",
    ".local/share/code-server/CachedData/",
    ".local/share/code-server/CachedExtensionVSIXs/",
    ".local/share/code-server/CachedProfilesData/",
    ".local/share/code-server/User/History/",  # VS Code's local history of every edit
)

#: what a store's and a grant's configuration may name (anything else is a typo, refused)
STORE_KEYS = ("kind", "endpoint_url", "region", "credentials", "root", "ca_bundle", "verify")
GRANT_KEYS = ("store", "bucket", "prefix", "modes", "users")


def _known_keys(what: str, d: Mapping, known: Sequence[str]) -> None:
    """A configured mapping names only ``known`` keys: a misspelt one (``endpoint`` for
    ``endpoint_url``) would be ignored and its default used without a word."""
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {unknown}; it takes {', '.join(known)}")


def _store(name: str, d: Mapping) -> ObjectStore:
    _known_keys(f"object store {name!r}", d, STORE_KEYS)
    creds = d.get("credentials") or {}
    unknown = set(creds) - {"access_key_env", "secret_key_env", "file", "profile"}
    if unknown:
        raise ValueError(
            f"object store {name!r}: credentials take access_key_env, secret_key_env or file "
            f"and profile (names, never values), not {sorted(unknown)}"
        )
    return ObjectStore(
        name=name,
        kind=d.get("kind", "s3"),
        endpoint_url=d.get("endpoint_url"),
        region=d.get("region", "us-east-1"),
        credentials=CredentialsSource(**creds),
        root=d.get("root"),
        ca_bundle=d.get("ca_bundle") or None,
        verify=d.get("verify", True),
    )


@dataclass(frozen=True)
class StorageConfig:
    stores: dict[str, ObjectStore]
    grants: tuple[Grant, ...]
    workspace: WorkspaceLocation | None

    @classmethod
    def from_config(
        cls,
        stores: Mapping[str, Mapping],
        grants: Sequence[Mapping],
        workspace_store: str = "",
        workspace_bucket: str = "gpulab-workspaces",
        workspace_root: str = "workspaces",
    ) -> StorageConfig:
        built = {name: _store(name, d) for name, d in stores.items()}
        for i, g in enumerate(grants):
            _known_keys(f"volume grant {i + 1} (of store {g.get('store')!r})", g, GRANT_KEYS)
        workspace = None
        if workspace_store:
            if workspace_store not in built:
                raise ValueError(f"workspace_store {workspace_store!r} is not an object store")
            validate_bucket_name(workspace_bucket)
            workspace = WorkspaceLocation(
                workspace_store, workspace_bucket, workspace_root.strip("/")
            )
        return cls(
            stores=built,
            grants=tuple(
                Grant(
                    store=g["store"],
                    bucket=g["bucket"],
                    prefix=str(g.get("prefix", "")).strip("/"),
                    modes=frozenset(g.get("modes", ("ro", "rw", "rwd"))),
                    users=frozenset(g["users"]) if g.get("users") is not None else None,
                )
                for g in grants
            ),
            workspace=workspace,
        )

    def workspace_spec(self, user: str, server: str, mount: str) -> VolumeSpec | None:
        """The notebook's workspace as a volume: deletions are propagated (rwd), so a file the
        user deleted does not come back at the next start."""
        if self.workspace is None:
            return None
        ws = self.workspace
        prefix = f"{ws.root}/{user}/{server or DEFAULT_SERVER_KEY}".strip("/")
        return VolumeSpec(ws.bucket, ws.store, prefix, mount, "rwd")

    def home_spec(self, user: str, server: str, mount: str) -> VolumeSpec | None:
        """The notebook's home as a volume (None without a workspace store): beside its
        workspace, under the user's own prefix (``<root>/<user>/.home/<server>``), so that
        the rules that keep a workspace its owner's (:func:`~gpulab.volumes.check_access`)
        keep the home theirs too; deletions are propagated (rwd), as a workspace's."""
        if self.workspace is None:
            return None
        ws = self.workspace
        key = server or DEFAULT_SERVER_KEY
        prefix = f"{ws.root}/{user}/{HOME_KEY}/{key}".strip("/")
        return VolumeSpec(ws.bucket, ws.store, prefix, mount, "rwd")

    def volume_pattern(self, user: str, workspace_dir: str) -> str | None:
        """The volume specs ``user`` may mount, as one pattern (None: none at all), for the
        OpenAPI document: :func:`~gpulab.volumes.access_pattern` of this configuration."""
        return access_pattern(user, self.stores, self.grants, self.workspace, workspace_dir)

    def user_volumes(self, user: str, specs: Iterable[str], workspace_dir: str) -> list[VolumeSpec]:
        """Parse and authorise a user's volume specs; VolumeError says what is wrong."""
        parsed = parse_volumes(list(specs), self.stores, workspace=workspace_dir)
        for spec in parsed:
            check_access(user, spec, self.grants, self.workspace)
        return parsed


__all__ = [
    "DEFAULT_HOME_EXCLUDE",
    "DEFAULT_SERVER_KEY",
    "HOME_KEY",
    "StorageConfig",
    "VolumeError",
]
