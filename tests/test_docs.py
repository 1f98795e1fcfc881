"""The docs hold together: the site builds with warnings as errors, the README's links land on real pages and
headings, every code block says its language, every TrainConfig field is documented, the pages speak to users
(not about how the project was built), and the repository keeps no large files.

The code blocks themselves run in tests/test_docs_python.py and tests/test_docs_shell.py.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from doc_pages import DOCS, README, ROOT, fence_languages, markdown_files, page_name, without_code

README_MAX_LINES = 320  # the front door; the guide lives in docs/
MAX_FILE_BYTES = 1_000_000


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page outside the nav, a docstring the API reference
    cannot read, or a ``:::`` directive naming a moved object fails."""
    began = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    site = tmp_path / "site"
    assert (site / "index.html").is_file() and (site / "reference" / "trainer" / "index.html").is_file()
    assert "gan_accel.GANTrainer" in (site / "reference" / "trainer" / "index.html").read_text()
    print(f"mkdocs build --strict: {time.perf_counter() - began:.1f} s")


def test_every_code_block_says_python_bash_or_text():
    """python blocks run (test_docs_python.py), bash blocks run (test_docs_shell.py), text blocks are output and
    listings; a block without a language would be run by neither."""
    for page in markdown_files():
        languages = fence_languages(page)
        assert set(languages) <= {"python", "bash", "text"}, (
            f"{page_name(page)}: code blocks must say python, bash or text: {languages}")


# -- links ------------------------------------------------------------------------------------------------------
def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def mkdocs_anchor(heading: str) -> str:
    """MkDocs' anchor of a heading (Python-Markdown's toc slugify), without the markup of its text."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def headings(page: Path) -> list[str]:
    return re.findall(r"(?m)^#{1,6} (.+?)\s*$", without_code(page.read_text()))


def anchors(page: Path) -> set[str]:
    """The anchors a link may name: a heading's, the same on GitHub and in the built site."""
    found = set()
    for heading in headings(page):
        assert github_anchor(heading) == mkdocs_anchor(heading), (
            f"{page_name(page)}: heading {heading!r} gets another anchor on GitHub ({github_anchor(heading)}) than "
            f"in the site ({mkdocs_anchor(heading)}); reword it so links work in both")
        found.add(github_anchor(heading))
    return found


def test_headings_have_one_anchor_each_on_github_and_in_the_site():
    for page in markdown_files():
        names = [github_anchor(heading) for heading in headings(page)]
        assert len(names) == len(set(names)), f"{page_name(page)}: two headings share an anchor: {sorted(names)}"
        anchors(page)


def test_readme_links_land_on_files_and_headings():
    """The README is read on GitHub: each relative link names a file of the repository, and an anchor a heading of
    that page (docs pages are checked by the strict build, the README is not part of the site)."""
    text = without_code(README.read_text())
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert any(link.startswith("docs/") for link in local), "the README maps the docs"
    for link in local:
        path, _, anchor = link.partition("#")
        target = (ROOT / path) if path else README
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor:
            assert target.suffix == ".md" and anchor in anchors(target), (
                f"README links to {link}: {page_name(target)} has no heading with that anchor "
                f"(its anchors: {sorted(anchors(target))})")


def test_table_rows_have_the_cells_of_their_header():
    """Every row of a table has as many cells as its header, counted as GitHub counts them: a ``|`` inside code
    ends a cell there too (the site would keep it, GitHub would shift the row)."""
    for page in markdown_files():
        header = None
        for line in without_code(page.read_text()).splitlines():
            if not line.startswith("|"):
                header = None
                continue
            cells = len(re.split(r"(?<!\\)\|", line.strip().strip("|")))
            if header is None:
                header = cells
            assert cells == header, f"{page_name(page)}: table row {line[:80]!r} has {cells} cells, its header {header}"


# -- what the pages say ------------------------------------------------------------------------------------
def test_every_config_field_is_documented():
    from gan_accel import TrainConfig

    table = (DOCS / "config.md").read_text()
    documented = set()
    for row in re.findall(r"(?m)^\| (`[^|]+) \|", table):
        documented |= set(re.findall(r"`(\w+)`", row))
    missing = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in documented]
    assert not missing, f"docs/config.md's table lacks TrainConfig fields {missing}"


# Words and references that tell how the project was built, not how to use it.
HISTORY = {
    "the day": re.compile(r"\b(?:today|yesterday|tonight)\b", re.IGNORECASE),
    "a work session": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "an issue or pull request": re.compile(r"\b(?:issues?|PRs?|pull requests?)\s*#?\d+\b|(?<![\w&/])#\d+\b",
                                           re.IGNORECASE),
    "a commit hash": re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])"),
}


def test_the_lint_finds_history():
    hits = {name: bool(rule.search(text)) for name, rule, text in (
        ("the day", HISTORY["the day"], "CPU speed, today at about 900"),
        ("session", HISTORY["a work session"], "an earlier session ran it"),
        ("issue", HISTORY["an issue or pull request"], "the issue 11 target"),
        ("issue number", HISTORY["an issue or pull request"], "fixed in #12"),
        ("hash", HISTORY["a commit hash"], "before the speed work (commit a554968)"),
    )}
    assert all(hits.values()), hits
    quiet = "weights-inception-2015-12-05-6726825d.pth, checkpoint_00000020, 1e-10, (#gradient-accumulation)"
    assert not any(rule.search(quiet) for rule in HISTORY.values())


def test_readme_is_the_front_door_and_the_pages_speak_to_users():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines: keep it the front door (at most {README_MAX_LINES}); the guide lives in docs/")
    found = []
    for page in markdown_files():
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            found += [f"{page_name(page)}:{number}: {name}: {line.strip()[:120]}"
                      for name, rule in HISTORY.items() if rule.search(line)]
    assert not found, "say how to use gan_accel, not how it was built:\n" + "\n".join(found)


def test_test_names_the_docs_cite_exist():
    """``tests/test_x.py`` and ``tests/test_x.py::test_name`` in the pages name real files and tests."""
    for page in markdown_files():
        for path, name in re.findall(r"(tests/test_\w+\.py)(?:::(\w+))?", page.read_text()):
            assert (ROOT / path).is_file(), f"{page_name(page)} cites {path}, which does not exist"
            if name:
                defined = {node.name for node in ast.walk(ast.parse((ROOT / path).read_text()))
                           if isinstance(node, ast.FunctionDef)}
                assert name in defined, f"{page_name(page)} cites {path}::{name}, which does not exist"


def test_every_test_file_says_what_it_proves():
    """The test catalogue is the test files themselves: each starts with a docstring saying what it proves."""
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        assert docstring and len(docstring.split()) >= 5, f"{path.name} needs a module docstring saying what it proves"


# -- the repository -----------------------------------------------------------------------------------------------
def test_no_tracked_file_is_over_1_mb():
    """Wheels, datasets, weights and run folders do not belong in the repository."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"git ls-files failed: {listed.stderr.strip()}")
    sizes = {name: (ROOT / name).stat().st_size for name in listed.stdout.split("\0")
             if name and (ROOT / name).is_file() and not (ROOT / name).is_symlink()}
    large = {name: size for name, size in sizes.items() if size > MAX_FILE_BYTES}
    assert sizes and not large, f"tracked files over {MAX_FILE_BYTES:,} bytes: {large}"
