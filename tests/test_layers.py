"""The layers hold by construction: ``make lint`` runs the import-linter contracts in
pyproject.toml; these tests keep the contracts themselves honest — every module sits in exactly
one layer (a new module cannot escape the contract), and the module import graph, lazy imports
included, has no cycle at all."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CONTAINERS = {"thoughtgate", "thoughtgate.events", "thoughtgate.access"}
"""Packages whose modules sit in different layers (their ``__init__`` imports nothing above)."""


def _layers() -> list[list[str]]:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [[part.strip() for part in line.replace(":", "|").split("|")] for line in layers]


def test_every_module_is_in_exactly_one_layer() -> None:
    graph = grimp.build_graph("thoughtgate")
    names = [name for layer in _layers() for name in layer]
    for module in sorted(graph.modules - CONTAINERS):
        owners = [n for n in names if module == n or module.startswith(n + ".")]
        assert len(owners) == 1, f"{module} is in {owners or 'no layer'}"


def test_the_import_graph_has_no_cycle() -> None:
    graph = grimp.build_graph("thoughtgate")
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            assert not graph.chain_exists(imported, importer), (
                f"{importer} -> {imported} closes a cycle: "
                f"{graph.find_shortest_chain(imported, importer)}"
            )
