"""Images from registries: a reference as Docker reads it, the admin's patterns, pull policies
and the credentials a user keeps as a gpulab secret. Pure: values in, values out.

A reference is read as Docker's ``distribution/reference`` grammar reads it: a first part with
a dot or a colon, or ``localhost``, names the registry, else it is Docker Hub (``docker.io``,
and a one-part name is ``library/NAME``); the tag defaults to ``latest``; a digest pins the
content. The admin's patterns (``image_registries``) are matched against the normalised name
``REGISTRY/REPOSITORY`` (no tag, no digest) with shell wildcards, where ``*`` stops at a ``/``
and ``**`` does not: ``ghcr.io/acme/*`` allows ``ghcr.io/acme/trainer`` but not
``ghcr.io/acme/team/trainer``; ``ghcr.io/acme/**`` allows both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

#: longest reference accepted (Docker's own limit on a name is 255 characters)
MAX_REF_CHARS = 255
#: the pull policies, as Run:ai and Kubernetes name them
PULL_POLICIES = ("always", "if-not-present", "never")
#: most patterns an admin may list (each one is matched at every submission)
MAX_PATTERNS = 200

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*"
_NAME = rf"(?:{_HOST}(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
#: a reference, as a JSON Schema (ECMA) pattern
REF_PATTERN = rf"^{_NAME}(?::{_TAG})?(?:@{_DIGEST})?$"
_REF = re.compile(rf"^(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$")
_PATTERN = re.compile(r"^[A-Za-z0-9.:_/*?\[\]-]{1,255}$")
DOCKER_HUB = "docker.io"


class ImageRefError(ValueError):
    """A reference, pattern or credential that cannot be used; the message says why (and never
    holds a credential)."""


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference: ``registry`` (``docker.io`` for Docker Hub), ``repository``
    (``library/python``), ``tag`` ("" when none is given: ``latest``, unless a digest pins
    it) and ``digest`` (``sha256:...``, or "")."""

    registry: str
    repository: str
    tag: str = ""
    digest: str = ""

    @property
    def name(self) -> str:
        """``REGISTRY/REPOSITORY``: what the admin's patterns are matched against."""
        return f"{self.registry}/{self.repository}"

    @property
    def engine_name(self) -> str:
        """The repository as the engine names it (Docker Hub's without its registry)."""
        if self.registry == DOCKER_HUB:
            repo = self.repository
            return repo[len("library/") :] if repo.startswith("library/") else repo
        return self.name

    def __str__(self) -> str:
        if self.digest:
            tagged = f"{self.engine_name}:{self.tag}" if self.tag else self.engine_name
            return f"{tagged}@{self.digest}"
        return f"{self.engine_name}:{self.tag or 'latest'}"

    def pinned(self, digest: str) -> str:
        """The reference that runs exactly ``digest``: ``NAME@sha256:...``."""
        return f"{self.engine_name}@{digest}"


def parse(ref: object) -> ImageRef:
    """``ref`` read as Docker reads it; :class:`ImageRefError` naming what is wrong."""
    if not isinstance(ref, str) or not ref:
        raise ImageRefError("an image reference is a non-empty string")
    if len(ref) > MAX_REF_CHARS:
        raise ImageRefError(f"an image reference is at most {MAX_REF_CHARS} characters")
    m = _REF.match(ref)
    if m is None:
        raise ImageRefError(
            "not an image reference: REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST], in lower case "
            "(e.g. ghcr.io/acme/trainer:1.2)"
        )
    name = m["name"]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first.lower(), rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry == "index.docker.io":
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    return ImageRef(registry, repository, m["tag"] or "", m["digest"] or "")


def check_patterns(patterns: object) -> tuple[str, ...]:
    """The admin's ``image_registries``: a list of ``REGISTRY/REPOSITORY`` patterns, each
    naming its registry (a pattern that starts with a wildcard would allow every registry)."""
    if not isinstance(patterns, list | tuple):
        raise ImageRefError("image_registries is a list of patterns")
    if len(patterns) > MAX_PATTERNS:
        raise ImageRefError(f"image_registries holds at most {MAX_PATTERNS} patterns")
    out = []
    for p in patterns:
        if not isinstance(p, str) or not _PATTERN.match(p):
            raise ImageRefError(
                f"image_registries: {p!r} is not a pattern REGISTRY/REPOSITORY with * or ** "
                "wildcards (e.g. ghcr.io/acme/*)"
            )
        registry, _, repo = p.partition("/")
        if (
            not repo
            or any(c in registry for c in "*?[]")
            or not ("." in registry or ":" in registry or registry == "localhost")
        ):
            raise ImageRefError(
                f"image_registries: {p!r} must name its registry, without wildcards, before "
                "the first / (e.g. ghcr.io/acme/*; Docker Hub is docker.io/library/NAME)"
            )
        out.append(registry.lower() + "/" + repo)
    return tuple(out)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                body = "^" + body[1:] if body.startswith("!") else body
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("^" + "".join(out) + "$")


def allowed(ref: ImageRef, patterns: tuple[str, ...] | list[str]) -> bool:
    """Whether one of the admin's ``patterns`` allows ``ref``'s registry and repository."""
    return any(_pattern_regex(p).match(ref.name) for p in patterns)


def check_policy(policy: object, field: str = "image_pull_policy") -> str:
    if policy not in PULL_POLICIES:
        raise ImageRefError(f"{field} is one of: {', '.join(PULL_POLICIES)}")
    return str(policy)


def registry_auth(secret: str, registry: str) -> dict[str, str]:
    """The engine's credentials for ``registry`` from a user's secret: ``USERNAME:PASSWORD``
    (or ``USERNAME:TOKEN``), or JSON ``{"username": ..., "password": ...}``. The error never
    repeats the secret."""
    user = password = None
    text = secret.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            user, password = data.get("username"), data.get("password")
    elif ":" in text:
        user, _, password = text.partition(":")
    if not isinstance(user, str) or not isinstance(password, str) or not user or not password:
        raise ImageRefError(
            'a registry secret holds USERNAME:PASSWORD or {"username": ..., "password": ...}'
        )
    if any(c in user for c in "\n\r\0") or len(user) > 255:
        raise ImageRefError("the registry secret's user name is one line of at most 255 characters")
    return {"username": user, "password": password, "serveraddress": registry}
