"""The README and the documentation site under docs/ hold together.

Pure Python (no mkdocs needed; CI also runs `mkdocs build --strict`): the README stays an
introduction of at most 250 lines, every relative link of the README and of docs/*.md
points at a file that exists (and, for a Markdown target, at a heading it has), every page
is in mkdocs.yml's navigation, and history stays in CHANGELOG.md.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"

LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str):
    """(line number, line) outside fenced and indented code blocks, inline code removed."""
    in_fence = False
    prev_blank = True
    for no, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if prev_blank and line.startswith("    "):  # an indented code block (the README's commands)
            continue
        prev_blank = not line.strip()
        yield no, re.sub(r"`[^`]*`", "", line)


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (mkdocs) gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link's text
    text = text.replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set:
    seen: dict = {}
    out = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            slug = _slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}_{n}")
    return out


def _pages():
    return sorted(p for p in DOCS.rglob("*.md"))


def _links(path: Path):
    for no, line in _prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            target = m.group("target")
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):   # http:, https:, mailto:
                continue
            yield no, target


def _nav_files(nav) -> list:
    out = []
    for item in nav:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                out.extend(_nav_files(value) if isinstance(value, list) else [value])
    return out


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move reference text to docs/"


def test_readme_keeps_the_fresh_machine_commands():
    # .ci/run runs the second one; both must work as written on a fresh machine
    text = README.read_text(encoding="utf-8")
    assert "    pip install torch==2.13.0 && pip install . && probe demo -o demo_out\n" in text
    assert '    pip install torch==2.13.0 && pip install -e ".[test]" && python3 -m pytest -q tests\n' in text


@pytest.mark.parametrize("path", [README] + _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    bad = []
    for no, target in _links(path):
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else (path.parent / file_part).resolve()
        if not dest.exists():
            bad.append(f"{path.name}:{no}: {target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{path.name}:{no}: {target}: {dest.name} has no heading '#{anchor}'")
    assert not bad, "\n".join(bad)


def test_links_are_found():
    # the link parser itself: a broken link must be seen, code must not be read as links
    sample = "see [a](x.md#y) and ![img](p.png)\n`[no](code.md)`\n```\n[no](fence.md)\n```\n"
    assert [t for _, t in _links_from_text(sample)] == ["x.md#y", "p.png"]
    assert _slug("Draw replay") == "draw-replay"
    assert _slug("`compare_summary.json`") == "compare_summaryjson"
    assert _slug("DDP and FSDP2") == "ddp-and-fsdp2"


def _links_from_text(text: str):
    for no, line in _prose_lines(text):
        for m in LINK.finditer(line):
            yield no, m.group("target")


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["name"] == "material"
    nav = _nav_files(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in _pages()}
    assert sorted(pages - set(nav)) == [], "docs pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - pages) == [], "mkdocs.yml's nav names pages that do not exist"
    assert "where-to-change.md" in nav


def test_ci_builds_the_site_strictly():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"mkdocs build --strict", ci)
    assert "site/" in (ROOT / ".gitignore").read_text(encoding="utf-8").split()


def test_history_is_in_the_changelog():
    # the README and the docs say what is; what changed when goes to CHANGELOG.md
    journal = re.compile(r"this round|\(issue #?\d+|\bissue #\d+", re.IGNORECASE)
    found = []
    for path in [README] + _pages():
        for no, line in _prose_lines(path.read_text(encoding="utf-8")):
            if journal.search(line):
                found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not found, "\n".join(found)
    dates = re.findall(r"^## (\d{4}-\d{2}-\d{2})", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert dates, "CHANGELOG.md has no dated sections"
    assert dates == sorted(dates, reverse=True), "CHANGELOG.md's sections are not newest first"
