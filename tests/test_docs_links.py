"""Every relative link in the README and docs/ resolves: the file exists and its #anchor names a
heading of that file (GitHub's anchors: lowercase, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lowercase, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page defines: its headings (repeats numbered -1, -2, ...) and HTML ids."""
    found, seen = set(), {}
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = heading_anchor(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    text = path.read_text(encoding="utf-8")
    found |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return found


def links(path: Path) -> list[str]:
    """The link targets written in ``path``'s prose (inline and reference-style)."""
    found = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # code spans show link syntax, they are not links
        found += INLINE_LINK.findall(line)
        m = REFERENCE_LINK.match(line)
        if m:
            found.append(m.group(1))
    return found


def shown(path: Path) -> str:
    """``path`` as the repository names it (as given when outside it)."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def broken(path: Path, target: str) -> str | None:
    """Why ``target`` (as written in ``path``) does not resolve, or None when it does."""
    if EXTERNAL.match(target):
        return None
    file_part, _, anchor = target.partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if not dest.exists():
        return f"{target}: {shown(dest)} does not exist"
    if anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
        return f"{target}: no heading of {shown(dest)} has the anchor #{anchor}"
    return None


LINKS = list(dict.fromkeys((p, t) for p in DOCS for t in links(p)))


def test_the_docs_have_links_to_check():
    assert any("#" in t for _, t in LINKS) and any(not t.startswith("#") for _, t in LINKS)


@pytest.mark.parametrize("path,target", LINKS, ids=[f"{shown(p)}:{t}" for p, t in LINKS])
def test_link_resolves(path, target):
    assert broken(path, target) is None, f"{shown(path)}: {broken(path, target)}"


def test_a_broken_link_and_anchor_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n## What `make bench` runs (CPU)\n\n## Twice\n\n## Twice\n\n"
        "[ok](#what-make-bench-runs-cpu) [ok](#twice-1) [ok](https://example.org/x#y)\n"
        "[gone](missing.md) [bad](#nowhere) `[code](missing.md)`\n\n```\n[fenced](missing.md)\n```\n"
    )
    found = {t: broken(page, t) for t in links(page)}
    assert sorted(t for t, why in found.items() if why) == ["#nowhere", "missing.md"]
    assert "does not exist" in found["missing.md"] and "#nowhere" in found["#nowhere"]
