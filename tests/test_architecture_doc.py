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


def test_doc_links_stay_inside_the_repository_and_resolve() -> None:
    pages = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z][a-z0-9+.-]*:", path):
                continue  # an anchor on the same page, or a URL
            resolved = (page.parent / path).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken
