"""The pages a user reads, in reading order, and their code blocks (for the docs tests).

The README comes first, then the pages of ``mkdocs.yml``'s ``nav`` in the order listed there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
FENCE = re.compile(r"(?ms)^```(\w*)\n(.*?)^```")


def nav_pages() -> list[Path]:
    """The docs pages in the order of mkdocs.yml's nav (``- Title: page.md`` or ``- page.md`` lines)."""
    text = MKDOCS_YML.read_text()
    nav = text[text.index("\nnav:"):]
    return [DOCS / name for name in re.findall(r"(?m)^\s*-\s+(?:[^:\n]+:\s+)?(\S+\.md)\s*$", nav)]


def pages() -> list[Path]:
    """Every page a user reads, in reading order: the README, then the docs."""
    return [README, *nav_pages()]


def markdown_files() -> list[Path]:
    """The README and every markdown file under docs/ (in the nav or not)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_name(page: Path) -> str:
    """``README.md``, ``docs/api.md``, ...: the page's path in the repository."""
    return page.relative_to(ROOT).as_posix()


def blocks(page: Path, language: str) -> list[str]:
    """The fenced code blocks of ``page`` in ``language`` (python, bash, text), in order."""
    return [body for lang, body in FENCE.findall(page.read_text()) if lang == language]


def fence_languages(page: Path) -> list[str]:
    """The language of every fenced block of ``page`` ('' for a block that names none)."""
    return [lang for lang, _ in FENCE.findall(page.read_text())]


def without_code(text: str) -> str:
    """The text with its fenced blocks removed (a ``# comment`` in a bash block is not a heading)."""
    return FENCE.sub("", text)
