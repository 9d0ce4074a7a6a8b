"""The ``git`` field of a job: repositories cloned into the job before its command starts.

    "git": [{"url": "https://host/org/repo.git", "branch": "main", "path": "/workspace/repo",
             "secret": "gitlab-token"}]

Each entry is cloned at INITIALIZING by a helper container (the sync image, never the user's
image), into a Docker volume of its own that the job's container mounts read-write at ``path``
(:mod:`gpulab.jobs.supervisor.git_sources` runs the helper, :mod:`gpulab.datasync.gitclone`
is what runs in it). This module only checks the submission, in the style of
:mod:`gpulab.jobs.spec.fields`: caps first (:mod:`gpulab.bounds`), then each entry, naming the
dotted field at fault (``git[0].url``).

Rules, and why:

- ``url`` is http(s) only: no ``file://`` (the helper's own files), no ssh or ``git://``
  (no keys to manage, no unauthenticated plain-text protocol), and no ``user:password@`` in
  it: a URL is shown back by the API, pages and events, so a credential there would leak.
  Credentials come from one of the owner's secrets (``secret``) instead.
- ``branch`` or ``revision`` (a tag, a commit or a full ref name), not both; neither is the
  remote's default branch. Both follow git's own ref-name rules, so that nothing that looks
  like an option or a path trick reaches the helper.
- ``path``: absolute and normalized, not ``/`` nor a system directory (a volume mounted over
  /usr or /etc would break or subvert the image), unique and not nested in another repository's
  path; default ``/workspace/<repository name>``.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ... import checks
from ...bounds import MAX_GIT_REF_CHARS, MAX_GIT_SOURCES, MAX_GIT_URL_CHARS, check_count, shown
from ...volumes import SPACE_CLASS
from .base import (
    MAX_PATH_CHARS,
    SYSTEM_DIRS,
    WORKSPACE_DIR,
    JobSpecError,
    check_secret,
    secret_name,
)

__all__ = ["GIT_FIELDS", "GitSource", "check_git_mounts", "parse_git"]

GIT_FIELDS = ("url", "branch", "revision", "path", "secret")
_GIT_FIELD_SET = frozenset(GIT_FIELDS)

#: git's ref-name rules (``git check-ref-format``), as one pattern the parser (fullmatch) and
#: the JSON Schema share: no control characters, space or ``~^:?*[\``; no ``..``, ``@{``,
#: ``//`` or a component starting with ``.``; not starting with ``-`` (an option) or ``/``;
#: not ending with ``/``, ``.`` or ``.lock``; not ``@`` alone
REF_PATTERN = (
    r"^(?![-/.])(?!.*(\.\.|@\{|//|/\.|\.lock/))(?!.*(\.lock|[/.])$)(?!@$)"
    r"[^\x00-\x20\x7f~^:?*\[\\]+$"
)
_REF_RE = re.compile(REF_PATTERN)
#: the URL's shape, for the parser (fullmatch) and the schema alike: http(s), a host (a name
#: or a bracketed IPv6 address) without user info, an optional port up to 65535, a path, and
#: no query or fragment
#: urlsplit refuses a host with a character whose NFKC form holds one of "/?#@:" (U+2100
#: "a/c", fullwidth "＠"...): these, as a regex class body
_NFKC_SEPARATORS = (
    r"\u2047-\u2049\u2100\u2101\u2105\u2106\u2a74\ufe13\ufe16\ufe55\ufe56\ufe5f\ufe6b"
    r"\uff03\uff0f\uff1a\uff1f\uff20"
)
#: an IPv6 address as ipaddress reads it in brackets (RFC 3986's IPv6address; an embedded
#: IPv4 address's numbers without leading zeros)
_H16 = "[0-9A-Fa-f]{1,4}"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LS32 = rf"({_H16}:{_H16}|{_OCTET}(\.{_OCTET}){{3}})"
_IPV6 = "|".join(
    [rf"({_H16}:){{6}}{_LS32}", rf"::({_H16}:){{5}}{_LS32}"]
    + [
        rf"(({_H16}:){{0,{k}}}{_H16})?::{tail}"
        for k, tail in enumerate(
            [rf"({_H16}:){{{4 - k}}}{_LS32}" for k in range(4)] + [_LS32, _H16, ""]
        )
    ]
)
#: no white space (what str.isspace() calls so: U+00A0, U+2028...) nor control characters
_NOT_BLANK = rf"\x00-\x20\x7f{SPACE_CLASS}"
_HOST = rf"([^/?#@\[\]:\\{_NOT_BLANK}{_NFKC_SEPARATORS}]+|\[({_IPV6})\])"
_PORT = r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?"
URL_PATTERN = rf"^[hH][tT][tT][pP][sS]?://{_HOST}{_PORT}(/[^?#{_NOT_BLANK}]*)?$"
_URL_RE = re.compile(URL_PATTERN)
#: an absolute, normalized path, not a system directory (the parser says which and why)
_SYSTEM_ALTERNATION = "|".join(re.escape(d[1:]) for d in SYSTEM_DIRS)
PATH_PATTERN = rf"^(?!/({_SYSTEM_ALTERNATION})(/|$))(/(?!\.\.?(/|$))[^/\x00]+)+$"
#: a repository name that can be a directory name as it is (the default path's last part)
_REPO_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
#: a URL whose path's last part is such a name (".git" and any trailing "/" aside): one whose
#: entry may leave out ``path`` (:func:`default_path`)
NAMED_URL_PATTERN = (
    rf"^[hH][tT][tT][pP][sS]?://{_HOST}{_PORT}(/[^?#{_NOT_BLANK}]*)?/{_REPO_NAME_RE.pattern}/*$"
)


@dataclass(frozen=True)
class GitSource:
    """One repository to clone: where from, which revision, where the job sees it, and the
    name (never the value) of the owner's secret that holds the HTTP credential."""

    url: str
    path: str
    branch: str | None = None
    revision: str | None = None
    secret: str | None = None

    @property
    def ref_text(self) -> str:
        """What is checked out, in words: ``branch main``, ``revision v1.2``, ``default branch``."""
        if self.branch:
            return f"branch {self.branch}"
        if self.revision:
            return f"revision {self.revision}"
        return "the default branch"

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "branch": self.branch,
            "revision": self.revision,
            "path": self.path,
            "secret": self.secret,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GitSource:
        """A stored entry (:meth:`to_json`'s output), trusted as it is."""
        return cls(
            url=str(d["url"]),
            path=str(d["path"]),
            branch=d.get("branch") or None,
            revision=d.get("revision") or None,
            secret=d.get("secret") or None,
        )


def _text(entry: Mapping, key: str, field: str, cap: int) -> str | None:
    """None and "" are absent; anything else a string of at most ``cap`` characters (a
    refusal does not name the value's type)."""
    return checks.optional_text(JobSpecError, field, entry.get(key), cap, typed=False)


def _url(entry: Mapping, key: str) -> str:
    field = f"{key}.url"
    url = _text(entry, "url", field, MAX_GIT_URL_CHARS)
    if url is None:
        raise JobSpecError(field, f"{field} is required: the repository's https:// URL")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise JobSpecError(field, f"{field} must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        _ = parts.port  # ValueError for a port that is not a number or out of range
        host = parts.hostname
    except ValueError as e:
        raise JobSpecError(field, f"{field} is not a valid URL ({e}): {shown(url)}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise JobSpecError(
            field,
            f"{field} must be an https:// (or http://) URL, not {shown(url)}: ssh, git:// and "
            "file URLs are not supported",
        )
    if "@" in parts.netloc:
        raise JobSpecError(
            field,
            f"{field} must not contain a user name or password: keep the credential in one of "
            'your secrets (gpulab secret set NAME) and give its name in "secret"',
        )
    if not host:
        raise JobSpecError(field, f"{field} has no host: {shown(url)}")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise JobSpecError(field, f"{field} must not have a query (?) or fragment (#)")
    if not _URL_RE.fullmatch(url):
        raise JobSpecError(
            field, f"{field} is not a valid URL (host, port up to 65535, path): {shown(url)}"
        )
    return url


def _ref(entry: Mapping, name: str, key: str) -> str | None:
    field = f"{key}.{name}"
    value = _text(entry, name, field, MAX_GIT_REF_CHARS)
    if value is not None and not _REF_RE.fullmatch(value):
        raise JobSpecError(
            field,
            f"{field} must be a valid git {'branch' if name == 'branch' else 'tag, commit or ref'}"
            f" name (no spaces, '..', '~^:?*[\\', not starting with '-'), not {shown(value)}",
        )
    return value


def default_path(url: str) -> str | None:
    """``https://host/org/repo.git`` -> ``/workspace/repo``; None when the URL's last part is
    not a plain directory name (the user must then give ``path``)."""
    name = urlsplit(url).path.rstrip("/").rpartition("/")[2]
    if name.endswith(".git"):
        name = name[: -len(".git")]
    if not _REPO_NAME_RE.fullmatch(name) or name in (".", ".."):
        return None
    return f"{WORKSPACE_DIR}/{name}"


def _path(entry: Mapping, key: str, url: str) -> str:
    field = f"{key}.path"
    value = _text(entry, "path", field, MAX_PATH_CHARS)
    if value is None:
        found = default_path(url)
        if found is None:
            raise JobSpecError(
                field,
                f"{field} is required for {shown(url)}: its name cannot be a directory name "
                "as it is (give an absolute path such as /workspace/src)",
            )
        return found
    if "\0" in value or not value.startswith("/") or posixpath.normpath(value) != value:
        raise JobSpecError(
            field,
            f"{field} must be an absolute, normalized path such as /workspace/repo (no '.', "
            f"'..', '//' or trailing '/'), not {shown(value)}",
        )
    if value == "/" or value.startswith("//"):
        raise JobSpecError(field, f"{field} cannot be the root directory")
    for d in SYSTEM_DIRS:
        if value == d or value.startswith(d + "/"):
            raise JobSpecError(
                field,
                f"{field} {value!r} is in the system directory {d}: clone under /workspace "
                "(or another directory of your own)",
            )
    return value


def _secret(entry: Mapping, key: str, secret_names: frozenset[str] | None) -> str | None:
    field = f"{key}.secret"
    value = entry.get("secret")
    if value is None or value == "":
        return None
    name = secret_name(field, value)
    check_secret(field, name, secret_names)
    return name


def _nested(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def parse_git(raw_value: object, secret_names: frozenset[str] | None) -> tuple[GitSource, ...]:
    """The ``git`` field of a submission (None or [] for none) as :class:`GitSource` entries,
    or :class:`~gpulab.jobs.spec.base.JobSpecError` naming the entry and field at fault.

    ``secret_names``: the names of the owner's secrets (None: secrets are not enabled, so an
    entry that names one is refused)."""
    if raw_value is None or raw_value == []:
        return ()
    help_ = 'git must be a list such as [{"url": "https://host/org/repo.git", "branch": "main"}]'
    if not isinstance(raw_value, list):
        raise JobSpecError("git", help_)
    check_count(JobSpecError, "git", len(raw_value), MAX_GIT_SOURCES, "repositories")
    out: list[GitSource] = []
    for i, entry in enumerate(raw_value):
        key = f"git[{i}]"
        if not isinstance(entry, Mapping):
            raise JobSpecError(key, help_)
        unknown = next((k for k in entry if k not in _GIT_FIELD_SET), None)
        if unknown is not None:
            raise JobSpecError(
                f"{key}.{str(unknown)[:64]}",
                f"unknown field {shown(unknown)}; a git entry takes: {', '.join(GIT_FIELDS)}",
            )
        url = _url(entry, key)
        branch = _ref(entry, "branch", key)
        revision = _ref(entry, "revision", key)
        if branch is not None and revision is not None:
            raise JobSpecError(
                f"{key}.revision",
                f"{key}: give branch or revision, not both (neither: the default branch)",
            )
        path = _path(entry, key, url)
        for j, other in enumerate(out):
            if _nested(path, other.path) or _nested(other.path, path):
                how = "the same as" if path == other.path else "nested with"
                raise JobSpecError(
                    f"{key}.path",
                    f"{key}.path {path!r} is {how} git[{j}].path {other.path!r}: give each "
                    "repository a directory of its own",
                )
        secret = _secret(entry, key, secret_names)
        out.append(GitSource(url, path, branch, revision, secret))
    return tuple(out)


def check_git_mounts(sources: Iterable[GitSource], mounts: Iterable[str]) -> None:
    """Refuse a repository's path that is also a data volume's mount (two volumes cannot be
    mounted at one place). A path inside a volume's mount (``/workspace/repo`` under a volume
    at ``/workspace``) is fine: the volume holds just the empty mount point, which its sync
    does not push."""
    taken = set(mounts)
    for i, src in enumerate(sources):
        if src.path in taken:
            raise JobSpecError(
                f"git[{i}].path",
                f"git[{i}].path {src.path!r} is also a volume's mount: give the repository "
                "another directory",
            )
