"""The docs say what the code does: docs/architecture.md lists the import-linter layers exactly as
pyproject.toml declares them (a layer added, removed or moved fails here until the page follows),
and no page links to a file that is missing or outside this repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _contract_layers() -> list[str]:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contracts["contracts"] if c["type"] == "layers"]
    return [" | ".join(part.strip() for part in line.split("|")) for line in layers]


def _documented_layers() -> list[str]:
    section = ARCHITECTURE.read_text().split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```text\n(.*?)```", section, re.S)
    assert match, "docs/architecture.md: the Layers section has no ```text block of layers"
    return [" | ".join(p.strip() for p in line.split("|")) for line in match[1].splitlines()]


def test_the_architecture_page_lists_the_contract_layers_top_to_bottom() -> None:
    assert _documented_layers() == _contract_layers()


def _pages() -> list[Path]:
    """Every Markdown page of the repository (not those of installed Node.js packages)."""
    pages = [REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").rglob("*.md")]
    pages += (p for p in (REPO / "tests").rglob("*.md") if "node_modules" not in p.parts)
    return sorted(pages)


def _anchors(page: Path) -> set[str]:
    """The ``#anchors`` GitHub makes of a page's headings: lower case, punctuation dropped,
    spaces as hyphens, a repeated heading's with ``-1``, ``-2``..."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def test_doc_links_stay_inside_the_repository_and_resolve() -> None:
    """Every relative link between the pages goes to a file of this repository that exists and,
    when it names a ``#section`` of a page, to a heading that page has."""
    broken = []
    for page in _pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path, _, anchor = target.partition("#")
            if re.match(r"[a-z][a-z0-9+.-]*:", path):
                continue  # a URL
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such section)")
    assert not broken, broken
