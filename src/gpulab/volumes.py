"""Data volumes: the ``container@store[/prefix]:/mount[:ro|rw|rwd]`` syntax and object stores.

Pure code, no I/O. A volume names a bucket ("container") on an object store configured by the
administrator, an optional key prefix, the mount path inside the workload, and a sync mode:

- ``ro`` (default): pulled before the workload starts, never pushed;
- ``rw``: pushed afterwards (additions and changes), remote objects are never deleted;
- ``rwd``: like ``rw`` and local deletions are propagated to the store.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .bounds import shown

#: the workspace bucket's prefix of every user's snapshots (``gpulab.snapshots`` keeps them
#: there; defined here, which the sync helper's image also holds, so that no volume reaches it)
SNAPSHOT_ROOT = "snapshots"

__all__ = [
    "MODES",
    "RESERVED_MOUNTS",
    "CredentialsSource",
    "Grant",
    "ObjectStore",
    "VolumeAccessError",
    "VolumeError",
    "VolumeSpec",
    "WorkspaceLocation",
    "check_access",
    "parse_volume",
    "parse_volumes",
    "validate_bucket_name",
]

Mode = Literal["ro", "rw", "rwd"]
MODES: tuple[Mode, ...] = ("ro", "rw", "rwd")

#: Paths a volume may not be mounted on, under, or above (it would hide them).
RESERVED_MOUNTS: tuple[str, ...] = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/bin",
    "/sbin",
    "/usr",
    "/lib",
    "/lib64",
    "/boot",
    "/var/run",
    "/run",
)

# Every pattern is matched in full (re.fullmatch): "$" alone would let a trailing newline in.
_SPEC_RE = re.compile(
    r"(?P<bucket>[^@:/\s]+)@(?P<store>[^/:\s]+)(?P<prefix>/[^:]*)?:(?P<mount>[^:]*)"
    r"(?::(?P<mode>[^:]*))?"
)
_STORE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_BUCKET_CHARS_RE = re.compile(r"[a-z0-9.-]+")
_IP_LIKE_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")
_ENDPOINT_RE = re.compile(r"https?://[^/@\s]+(/.*)?")
#: control characters have no place in a key prefix or a mount path (newlines in logs, names)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_SYNTAX_HELP = "expected container@store[/prefix]:/mount/path[:ro|rw|rwd]"

# --- the same rules as one pattern, for the OpenAPI document's JSON Schema --------------------
# ECMA-262 and Python read these patterns alike (no \\s, \\d or \\w, whose meanings differ;
# negative lookaheads only, which a generator of examples can skip and filter on). Unit tests
# hold them to parse_volume and check_access.

#: white space as str.strip() removes it from a spec's ends (what str.isspace() calls white
#: space, as a regex class body; a unit test compares the two)
SPACE_CLASS = r"\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CTRL_CLASS = r"\x00-\x1f\x7f"
#: the rest of the spec is white space to its end (what strip() drops)
_TO_END = rf"[{SPACE_CLASS}]*$"
#: a bucket name by the S3 rules of :func:`validate_bucket_name` (it is followed by its "@")
_BUCKET_PATTERN = (
    r"(?![0-9]{1,3}(\.[0-9]{1,3}){3}@)(?![a-z0-9.-]*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
)
#: one segment of a key prefix (followed by "/" or the ":" before the mount): not . or ..
_PREFIX_SEGMENT = rf"(?!\.\.?[/:])[^/:{_CTRL_CLASS}]+"
_PREFIX_SEGMENTS = rf"{_PREFIX_SEGMENT}(/{_PREFIX_SEGMENT})*"
#: any key prefix: none, "/" or "//" (the whole bucket), or segments with one trailing "/"
_ANY_PREFIX = rf"(/({_PREFIX_SEGMENTS}/?|/)?)?"
#: one segment of a mount path (followed by "/", the ":" of a mode, or the end): not . or ..
_MOUNT_SEGMENT = rf"(?!\.\.?(/|:|{_TO_END}))[^/:{_CTRL_CLASS}]+"
_MODE = "(:(" + "|".join(sorted(MODES, key=len, reverse=True)) + "))?"


def _literal(text: str) -> str:
    """``text`` matched as it is: its regex syntax characters escaped (only those: ECMA's
    unicode mode refuses an escaped "-" or letter, which re.escape may write)."""
    return re.sub(r"[\\^$.|?*+()\[\]{}]", lambda m: "\\" + m[0], text)


def _mount_pattern(workspace: str) -> str:
    """An absolute mount path (any number of leading "/", one between segments, any after),
    not "/" and neither in nor above a reserved path or the workspace, then the mode."""
    taken = [posixpath.normpath(p) for p in (*RESERVED_MOUNTS, workspace)]
    above = sorted({p[:i] for p in taken for i in range(1, len(p)) if p[i] == "/"} - set(taken))
    inside = "|".join(_literal(p[1:]) for p in taken)
    refused = [rf"({inside})(/|:|{_TO_END})", rf"[{SPACE_CLASS}]*$"]
    if above:
        refused.append("(" + "|".join(_literal(p[1:]) for p in above) + rf")/*(:|{_TO_END})")
    return f"/+(?!{'|'.join(refused)}){_MOUNT_SEGMENT}(/{_MOUNT_SEGMENT})*/*{_MODE}{_TO_END}"


def volume_pattern(workspace: str = "/workspace") -> str:
    """A spec's syntax as :func:`parse_volume` reads it, for a store of any name."""
    store = _STORE_NAME_RE.pattern
    return rf"^[{SPACE_CLASS}]*{_BUCKET_PATTERN}@{store}{_ANY_PREFIX}:{_mount_pattern(workspace)}"


class VolumeError(ValueError):
    """A volume specification or store configuration is invalid (message names the spec)."""


class VolumeAccessError(VolumeError):
    """The user may not use this bucket/prefix (or with this mode)."""


@dataclass(frozen=True)
class CredentialsSource:
    """Where the sync helper finds the store's credentials: never the values themselves.

    Either two environment variable names, or a file path (an AWS shared-credentials or
    config file, whose ``profile`` is used, else its ``[default]``; or ``KEY=VALUE`` lines).
    Holding only names keeps secrets out of any ``repr`` or log line.
    """

    access_key_env: str = "AWS_ACCESS_KEY_ID"
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    file: str | None = None
    profile: str | None = None


@dataclass(frozen=True)
class ObjectStore:
    """An object storage endpoint configured by the administrator.

    ``kind="s3"``: an S3-compatible endpoint (``endpoint_url`` None means AWS itself).
    ``kind="filesystem"``: the embedded default, objects persisted under the ``root`` directory
    with the same sync semantics as S3.

    ``ca_bundle``: a PEM file on the hub's host of the CAs that sign the endpoint's TLS
    certificate (a store behind a private CA); ``verify=False`` turns the certificate check
    off (a lab only).
    """

    name: str
    kind: Literal["s3", "filesystem"] = "s3"
    endpoint_url: str | None = None
    region: str = "us-east-1"
    credentials: CredentialsSource = field(default_factory=CredentialsSource)
    root: str | None = None
    ca_bundle: str | None = None
    verify: bool = True

    def __post_init__(self) -> None:
        if not _STORE_NAME_RE.fullmatch(self.name or ""):
            raise VolumeError(
                f"object store name {self.name!r} is invalid: use letters, digits, '.', '_', '-'"
            )
        if self.kind not in ("s3", "filesystem"):
            raise VolumeError(
                f"object store {self.name!r}: kind must be 's3' or 'filesystem', not {self.kind!r}"
            )
        if self.kind == "filesystem" and not (self.root and self.root.startswith("/")):
            raise VolumeError(
                f"object store {self.name!r}: a filesystem store needs an absolute 'root' directory"
            )
        if self.endpoint_url is not None:
            url = self.endpoint_url
            if not _ENDPOINT_RE.fullmatch(url):
                raise VolumeError(
                    f"object store {self.name!r}: endpoint_url must be http(s)://host[:port] "
                    "without credentials in it"
                )
        if not isinstance(self.verify, bool):
            raise VolumeError(f"object store {self.name!r}: verify must be True or False")
        if self.ca_bundle is not None:
            if not (isinstance(self.ca_bundle, str) and self.ca_bundle.startswith("/")):
                raise VolumeError(
                    f"object store {self.name!r}: ca_bundle must be an absolute path on the "
                    "hub's host"
                )
            if not self.verify:
                raise VolumeError(
                    f"object store {self.name!r}: ca_bundle and verify=False contradict each "
                    "other (a CA bundle is for verifying)"
                )
        if self.kind == "filesystem" and (self.ca_bundle or not self.verify):
            raise VolumeError(
                f"object store {self.name!r}: ca_bundle and verify are for S3 stores only"
            )
        profile = self.credentials.profile
        if profile is not None and not (isinstance(profile, str) and profile.strip()):
            raise VolumeError(f"object store {self.name!r}: credentials.profile must be a name")
        if profile is not None and not self.credentials.file:
            raise VolumeError(
                f"object store {self.name!r}: credentials.profile names a profile of a "
                "credentials file: give the file too"
            )


@dataclass(frozen=True)
class VolumeSpec:
    """A parsed volume. ``prefix`` has no leading/trailing slash ("" = whole bucket)."""

    bucket: str
    store: str
    prefix: str
    mount: str
    mode: Mode = "ro"

    @property
    def pushes(self) -> bool:
        """True when the volume is pushed back to the store after the workload."""
        return self.mode != "ro"

    @property
    def deletes(self) -> bool:
        """True when local deletions are propagated to the store."""
        return self.mode == "rwd"

    def __str__(self) -> str:
        prefix = f"/{self.prefix}" if self.prefix else ""
        return f"{self.bucket}@{self.store}{prefix}:{self.mount}:{self.mode}"


def validate_bucket_name(bucket: str) -> None:
    """Raise VolumeError unless ``bucket`` follows the S3 bucket naming rules."""
    problem = _bucket_problem(bucket)
    if problem:
        raise VolumeError(f"invalid bucket name {bucket!r}: {problem}")


def _bucket_problem(bucket: str) -> str | None:
    if not 3 <= len(bucket) <= 63:
        return "must be 3 to 63 characters long"
    if not _BUCKET_CHARS_RE.fullmatch(bucket):
        return "only lowercase letters, digits, '.' and '-' are allowed"
    if not (bucket[0].isalnum() and bucket[-1].isalnum()):
        return "must start and end with a letter or digit"
    if ".." in bucket:
        return "must not contain '..'"
    if _IP_LIKE_RE.fullmatch(bucket):
        return "must not look like an IP address"
    return None


def _store_names(stores: Mapping[str, ObjectStore] | Iterable[str]) -> set[str]:
    if isinstance(stores, Mapping):
        return set(stores)
    return {s.name if isinstance(s, ObjectStore) else s for s in stores}


def _is_within(path: str, root: str) -> bool:
    """True if ``path`` equals ``root`` or lies under it (both normalised, absolute)."""
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def _check_mount(spec: str, mount: str, workspace: str) -> str:
    if not mount:
        raise VolumeError(f"volume {spec!r}: missing mount path ({_SYNTAX_HELP})")
    if not mount.startswith("/"):
        raise VolumeError(f"volume {spec!r}: mount path {mount!r} must be absolute (start with /)")
    segments = mount.strip("/").split("/")
    if mount != "/" and any(s in ("", ".", "..") for s in segments):
        raise VolumeError(
            f"volume {spec!r}: mount path {mount!r} must not contain empty, '.' or '..' segments"
        )
    # every leading "/" as one: POSIX keeps exactly two ("//etc"), which would slip past the
    # reserved paths and the workspace below, yet the engine mounts it at /etc
    norm = posixpath.normpath("/" + mount.lstrip("/"))
    if norm == "/":
        raise VolumeError(f"volume {spec!r}: cannot mount a volume on '/'")
    for reserved in RESERVED_MOUNTS:
        if _is_within(norm, reserved) or _is_within(reserved, norm):
            raise VolumeError(
                f"volume {spec!r}: mount path {norm!r} is reserved (conflicts with {reserved}); "
                "mount data volumes under e.g. /data/<name>"
            )
    ws = posixpath.normpath(workspace)
    if _is_within(norm, ws) or _is_within(ws, norm):
        raise VolumeError(
            f"volume {spec!r}: mount path {norm!r} overlaps the workspace {ws!r}, which is synced "
            "on its own; mount data volumes elsewhere, e.g. /data/<name>"
        )
    return norm


def _check_prefix(spec: str, raw: str | None) -> str:
    if not raw:
        return ""
    prefix = raw[1:]  # drop the "/" separating it from the store name
    if prefix.endswith("/"):
        prefix = prefix[:-1]
    if not prefix:
        return ""
    segments = prefix.split("/")
    if any(s == "" for s in segments):
        raise VolumeError(f"volume {spec!r}: prefix {prefix!r} contains an empty segment ('//')")
    if any(s in (".", "..") for s in segments):
        raise VolumeError(f"volume {spec!r}: prefix {prefix!r} must not contain '.' or '..'")
    return prefix


def parse_volume(
    spec: str,
    stores: Mapping[str, ObjectStore] | Iterable[str],
    workspace: str = "/workspace",
) -> VolumeSpec:
    """Parse one ``container@store[/prefix]:/mount/path[:ro|rw|rwd]`` specification."""
    if not isinstance(spec, str):
        raise VolumeError(f"volume {shown(spec)} is malformed: {_SYNTAX_HELP}")
    # (no length cap here: callers cap what users send, gpulab.bounds.MAX_VOLUME_SPEC_CHARS;
    # a stored spec, normalised with its mode, may be a few characters longer)
    spec = spec.strip()
    if _CONTROL_RE.search(spec):
        raise VolumeError(f"volume {spec!r} contains control characters: {_SYNTAX_HELP}")
    m = _SPEC_RE.fullmatch(spec)
    if not m:
        raise VolumeError(f"volume {spec!r} is malformed: {_SYNTAX_HELP}")
    bucket, store = m["bucket"], m["store"]
    names = _store_names(stores)
    if store not in names:
        known = ", ".join(sorted(names)) or "none configured"
        raise VolumeError(f"volume {spec!r}: unknown object store {store!r} (known: {known})")
    problem = _bucket_problem(bucket)
    if problem:
        raise VolumeError(f"volume {spec!r}: invalid bucket name {bucket!r}: {problem}")
    prefix = _check_prefix(spec, m["prefix"])
    mount = _check_mount(spec, m["mount"], workspace)
    mode = m["mode"] if m["mode"] is not None else "ro"
    if mode not in MODES:
        raise VolumeError(f"volume {spec!r}: unknown mode {mode!r} (use ro, rw or rwd)")
    return VolumeSpec(bucket=bucket, store=store, prefix=prefix, mount=mount, mode=mode)


def parse_volumes(
    specs: Sequence[str],
    stores: Mapping[str, ObjectStore] | Iterable[str],
    workspace: str = "/workspace",
) -> list[VolumeSpec]:
    """Parse several volumes; two volumes may not share a mount or be nested in one another.

    The overlap check sorts the mounts (O(n log n), not a comparison of every pair): with
    ``mount + "/"`` as the key, the mounts under a path ``p`` are exactly the keys that start
    with ``p/``, and they sort right after ``p/`` itself, so any overlap shows up between
    neighbours. Callers cap the count (:data:`gpulab.bounds.MAX_VOLUMES`) before calling.
    """
    names = _store_names(stores)
    parsed = [parse_volume(s, names, workspace) for s in specs]
    ordered = sorted(parsed, key=lambda v: v.mount + "/")
    for a, b in zip(ordered, ordered[1:], strict=False):
        if a.mount == b.mount:
            raise VolumeError(f"volumes {str(a)!r} and {str(b)!r} use the same mount path")
        if b.mount.startswith(a.mount + "/"):
            raise VolumeError(
                f"volumes {str(a)!r} and {str(b)!r} are nested: one mount path lies inside "
                "the other"
            )
    return parsed


@dataclass(frozen=True)
class Grant:
    """An administrator's permission: ``bucket`` on ``store`` under ``prefix`` ("" = all).

    ``users`` None means every user; ``modes`` lists the modes allowed.
    """

    store: str
    bucket: str
    prefix: str = ""
    modes: frozenset[str] = frozenset(MODES)
    users: frozenset[str] | None = None


@dataclass(frozen=True)
class WorkspaceLocation:
    """Where users' workspaces live: ``<root>/<user>/`` in ``bucket`` on ``store``."""

    store: str
    bucket: str
    root: str = "workspaces"


def _prefix_within(prefix: str, root: str) -> bool:
    return not root or prefix == root or prefix.startswith(root.rstrip("/") + "/")


def check_access(
    user: str,
    spec: VolumeSpec,
    allowed: Iterable[Grant],
    workspaces: WorkspaceLocation | None = None,
) -> None:
    """Raise VolumeAccessError unless ``user`` may use ``spec``.

    A user's own workspace prefix is always theirs; another user's workspace (or a prefix
    that contains other workspaces) is refused whatever the grants say. Without
    ``workspaces``, ``workspaces/<other user>/`` is refused in every bucket. Anything else needs a
    grant covering the store, bucket, prefix and mode.
    """
    if workspaces is None:
        # Location unknown: still refuse another user's workspace prefix in any bucket.
        own = f"workspaces/{user}"
        inside = _prefix_within(spec.prefix, "workspaces") and spec.prefix != "workspaces"
        if inside and not _prefix_within(spec.prefix, own):
            raise VolumeAccessError(
                f"volume {str(spec)!r}: prefix {spec.prefix!r} is another user's "
                f"workspace; yours is {own}/"
            )
    elif (spec.store, spec.bucket) == (workspaces.store, workspaces.bucket):
        root = workspaces.root.strip("/")
        own = f"{root}/{user}"
        if _prefix_within(spec.prefix, own):
            return
        if _prefix_within(spec.prefix, root) and spec.prefix != root:
            raise VolumeAccessError(
                f"volume {str(spec)!r}: prefix {spec.prefix!r} is another user's workspace; "
                f"yours is {own}/"
            )
        if _prefix_within(root, spec.prefix):
            raise VolumeAccessError(
                f"volume {str(spec)!r}: prefix {spec.prefix or '(whole bucket)'!r} contains "
                f"other users' workspaces; use {own}/"
            )
        # every user's snapshots (gpulab.snapshots: SNAPSHOT_ROOT/<user>/) live beside the
        # workspaces; they are reached through the snapshots API only, whatever a grant says
        if _prefix_within(spec.prefix, SNAPSHOT_ROOT) or _prefix_within(SNAPSHOT_ROOT, spec.prefix):
            raise VolumeAccessError(
                f"volume {str(spec)!r}: prefix {spec.prefix or '(whole bucket)'!r} holds "
                "users' snapshots, which only the snapshots API reaches (gpulab snapshot ...)"
            )
    mode_refused: list[Grant] = []
    for grant in allowed:
        if (grant.store, grant.bucket) != (spec.store, spec.bucket):
            continue
        if grant.users is not None and user not in grant.users:
            continue
        if not _prefix_within(spec.prefix, grant.prefix.strip("/")):
            continue
        if spec.mode in grant.modes:
            return
        mode_refused.append(grant)
    if mode_refused:
        modes = sorted({m for g in mode_refused for m in g.modes})
        raise VolumeAccessError(
            f"volume {str(spec)!r}: mode {spec.mode!r} is not allowed here (allowed: "
            f"{', '.join(modes) or 'none'})"
        )
    raise VolumeAccessError(
        f"volume {str(spec)!r}: user {user!r} may not use bucket {spec.bucket!r} "
        f"prefix {spec.prefix or '(whole bucket)'!r} on store {spec.store!r}; ask an "
        "administrator for access"
    )


def _valid_prefix(prefix: str) -> bool:
    """Whether ``prefix`` (normalized: no leading or trailing "/") is one a spec can give."""
    return not prefix or (
        not _CONTROL_RE.search(prefix)
        and ":" not in prefix
        and all(s not in ("", ".", "..") for s in prefix.split("/"))
    )


def _within(prefix: str) -> str:
    """The key prefixes within ``prefix`` as a spec writes them (before its ":")."""
    if not prefix:
        return _ANY_PREFIX
    return f"/{_literal(prefix)}(/{_PREFIX_SEGMENTS})?/?"


def _equal(prefix: str) -> str:
    """``prefix`` itself as a spec writes it, and the ":" after it (a lookahead's body)."""
    return "/{0,2}:" if not prefix else f"/{_literal(prefix)}/?:"


def access_pattern(
    user: str,
    stores: Iterable[str],
    grants: Iterable[Grant],
    workspaces: WorkspaceLocation | None = None,
    workspace_dir: str = "/workspace",
) -> str | None:
    """The specs ``user`` may mount, as one pattern: :func:`volume_pattern`'s syntax with
    what :func:`check_access` allows (their own workspace, the grants that cover them, each
    with its modes) on the configured ``stores``. None where they may mount nothing. No
    ``user`` (""): what every user may mount, no workspace prefix.

    What one spec alone cannot say stays with the parser: two volumes that share a mount
    path or lie one inside the other."""
    names = set(stores)
    branches: list[str] = []

    def branch(store: str, bucket: str, refused: list[str], within: str, modes) -> None:
        modes = [m for m in MODES if m in modes]
        if store not in names or _bucket_problem(bucket) or not modes:
            return
        others = [m for m in MODES if m not in modes]
        barred = [rf":[^:]*:({'|'.join(others)}){_TO_END}"] if others else []
        if "ro" not in modes:  # a spec without a mode is "ro"
            barred.append(":[^:]*$")
        text = f"{_literal(bucket)}@{_literal(store)}"
        text += f"(?!{'|'.join(refused)})" if refused else ""
        text += within + (f"(?!{'|'.join(barred)})" if barred else "")
        if text not in branches:
            branches.append(text)

    # no user (the document read without a token): nobody's workspace is theirs
    if workspaces is None:
        # another user's workspace prefix, in any bucket
        yours = f"(?!{_literal(user)}[/:])" if user else ""
        refused_everywhere = [f"/workspaces/(?!:){yours}"]
    else:
        refused_everywhere = []
        root = workspaces.root.strip("/")
        own = f"{root}/{user}"
        if root and user and _valid_prefix(own):
            branch(workspaces.store, workspaces.bucket, [], _within(own), MODES)
    for g in grants:
        prefix = g.prefix.strip("/")
        if (g.users is not None and user not in g.users) or not _valid_prefix(prefix):
            continue
        refused = list(refused_everywhere)
        if workspaces is not None and (g.store, g.bucket) == (workspaces.store, workspaces.bucket):
            root = workspaces.root.strip("/")
            if not root:
                continue  # every prefix there is refused
            # within the root (not the root itself), or the root or a prefix above it
            ancestors = {""} | {root[:i] for i, c in enumerate(root) if c == "/"} | {root}
            refused.append(f"/{_literal(root)}/(?!:)")
            refused += [_equal(a) for a in sorted(ancestors)]
        branch(g.store, g.bucket, refused, _within(prefix), g.modes)
    if not branches:
        return None
    return f"^[{SPACE_CLASS}]*({'|'.join(branches)}):{_mount_pattern(workspace_dir)}"
