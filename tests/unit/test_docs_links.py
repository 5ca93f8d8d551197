"""README.md and the pages under docs/ are self-contained: every link resolves to a file (and heading) inside the
repository, none leaves it (a clone has nothing outside it), and the README stays short enough to read."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def links(page: Path) -> list[str]:
    """The targets of the page's markdown links and images, outside code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [m.group(1) or m.group(2) for m in LINK.finditer(text)]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.replace("`", "").lower()).replace(" ", "-") for h in headings}


def problem(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return "leaves the repository (a URL): name the source in the text instead"
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if ROOT not in (dest, *dest.parents):
        return "points outside the repository"
    if not dest.exists():
        return "does not exist"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"has no heading #{anchor}"
    return None


def test_every_link_of_the_readme_and_docs_resolves_inside_the_repository() -> None:
    broken = [f"{page.relative_to(ROOT)}: ({target}) {why}" for page in pages() for target in links(page)
              if (why := problem(page, target))]
    assert not broken, "\n".join(broken)


def test_readme_is_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (limit {README_MAX_LINES})"
