"""The docs as data: their pages, fenced blocks, links and headings' anchors.

Used by tests/unit/test_docs_links.py (links, anchors, pictures, every block says what it is)
and tests/integration/test_docs_commands.py (every shell block runs, or says why not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: a fence's language that makes it a command block: run by the docs' test, or carrying a
#: reason it is not, in an HTML comment right above it
SHELL = {"sh", "bash", "shell", "console"}
#: the comment that says why a shell block is not run here
NOT_RUN = re.compile(r"<!--\s*not run here:\s*(?P<why>\S.*?)\s*-->", re.S)

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[^\s`]*)\s*$")
_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    """README.md and every page under docs/ (the repository's other top-level pages too)."""
    top = [REPO / name for name in ("README.md", "SECURITY.md", "ARCHITECTURE.md", "CHANGELOG.md")]
    return [p for p in top if p.exists()] + sorted((REPO / "docs").rglob("*.md"))


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str  # the block's lines, their fence's indentation removed
    not_run: str | None  # the reason given right above it, if any

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def shell(self) -> bool:
        return self.lang in SHELL


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group("indent"))
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = "\n".join(line[indent:] for line in lines[i + 1 : j])
        # the reason: an HTML comment ending on the last non-blank line before the fence
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        why = None
        if k >= 0 and lines[k].strip().endswith("-->"):
            start = k
            while start > 0 and "<!--" not in lines[start]:
                start -= 1
            reason = NOT_RUN.search("\n".join(lines[start : k + 1]))
            why = reason.group("why") if reason else None
        found.append(Block(page, i + 1, m.group("lang"), body, why))
        i = j + 1
    return found


def _outside_blocks(page: Path) -> str:
    """The page's text without its fenced blocks and inline code (whose brackets are no links)."""
    text, inside = [], False
    for line in page.read_text().splitlines():
        if _FENCE.match(line) or re.match(r"^\s*```\s*$", line):
            inside = not inside
            continue
        if not inside:
            text.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(text)


def links(page: Path) -> list[str]:
    return [a or b for a, b in _LINK.findall(_outside_blocks(page))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    inside = False
    for line in page.read_text().splitlines():
        if _FENCE.match(line) or re.match(r"^\s*```\s*$", line):
            inside = not inside
            continue
        m = None if inside else _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found
