"""Paths a sync leaves alone: an exclusion list, matched as data (pure).

A notebook's home holds caches (pip's, the editor's logs, ``__pycache__``) that cost storage
and time and come back by themselves; the operator names them in a list of patterns
(``c.GpulabSettings.home_exclude``) and the sync helper is handed it (``--exclude``). An
excluded path is invisible to the sync in both directions:

- a push neither uploads it (an excluded directory is not even read) nor, in ``rwd``, deletes
  its object from the store;
- a pull neither downloads its object nor, mirroring (``--delete``), removes the local file.

So a pattern added later leaves what was already stored where it is (until the volume is
purged) and never deletes anything on either side.

The rules, gitignore's in small:

- a pattern is a relative path of ``/``-separated parts, each matched with ``fnmatch``'s
  ``*``, ``?`` and ``[...]`` (case-sensitive); ``**`` as a whole part matches any number of
  directories, none included;
- a pattern with no ``/`` but a trailing one matches that name at any depth
  (``.cache/``, ``__pycache__/``, ``*.pyc``); one with a ``/`` inside is anchored at the
  volume's root (``.local/share/Trash/``);
- a trailing ``/`` matches directories only; a directory that matches excludes everything
  below it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

#: bounds of one list (a configuration's, or a command line's)
MAX_PATTERNS = 100
MAX_PATTERN_LENGTH = 200


class ExcludeError(ValueError):
    """A pattern that cannot be used (says which and why)."""


@dataclass(frozen=True)
class _Pattern:
    parts: tuple[str, ...]
    anchored: bool
    dir_only: bool


def _parse(pattern: str) -> _Pattern:
    if not isinstance(pattern, str) or not pattern.strip():
        raise ExcludeError(f"exclude pattern {pattern!r}: empty")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ExcludeError(f"exclude pattern {pattern[:40]!r}...: longer than {MAX_PATTERN_LENGTH}")
    if any(ord(ch) < 32 or ch == "\x7f" for ch in pattern):
        raise ExcludeError(f"exclude pattern {pattern!r}: control characters")
    if pattern.startswith("/"):
        raise ExcludeError(
            f"exclude pattern {pattern!r}: relative to the volume's root, without a leading /"
        )
    dir_only = pattern.endswith("/")
    body = pattern.rstrip("/")
    parts = tuple(body.split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise ExcludeError(f"exclude pattern {pattern!r}: empty, '.' or '..' parts")
    return _Pattern(parts, anchored=len(parts) > 1, dir_only=dir_only)


def _match(parts: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether the pattern's ``parts`` match the whole of ``path`` (``**``: any number)."""
    if not parts:
        return not path
    head, rest = parts[0], parts[1:]
    if head == "**":
        return any(_match(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatchcase(path[0], head) and _match(rest, path[1:])


class Excludes:
    """An exclusion list; :meth:`excludes` says whether it covers a path."""

    def __init__(self, patterns: Iterable[str] = ()):
        patterns = list(patterns)
        if len(patterns) > MAX_PATTERNS:
            raise ExcludeError(f"more than {MAX_PATTERNS} exclude patterns")
        self.patterns = tuple(patterns)
        self._parsed = tuple(_parse(p) for p in patterns)

    def __bool__(self) -> bool:
        return bool(self._parsed)

    def matches(self, rel: str, is_dir: bool) -> bool:
        """Whether one path itself (``a/b/c``, relative to the root; a directory or a file)
        matches a pattern; what is above it is not looked at (see :meth:`excludes`)."""
        path = tuple(rel.strip("/").split("/"))
        for p in self._parsed:
            if p.dir_only and not is_dir:
                continue
            if p.anchored:
                if _match(p.parts, path):
                    return True
            elif fnmatchcase(path[-1], p.parts[0]):
                return True
        return False

    def excludes(self, rel: str) -> bool:
        """Whether the file at ``rel`` is excluded: it matches, or a directory above it does."""
        if not self._parsed:
            return False
        parts = rel.strip("/").split("/")
        for i in range(1, len(parts)):
            if self.matches("/".join(parts[:i]), is_dir=True):
                return True
        return self.matches("/".join(parts), is_dir=False)


def check_patterns(patterns: Iterable[str]) -> list[str]:
    """The patterns, checked (ExcludeError naming the first bad one): the start-up check of
    a configured list."""
    return list(Excludes(patterns).patterns)
