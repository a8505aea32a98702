"""DBOS's private names thoughtgate uses: every one is in the installed dbos, each is read only
through ``thoughtgate.orchestration.dbos_private``, and one that is gone fails loudly, naming the
dbos version, rather than quietly changing what thoughtgate does (ADR 0136, amendment 2)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS

from thoughtgate.errors import RuntimeFailure
from thoughtgate.orchestration import dbos_private
from thoughtgate.orchestration.dbos_pollers import slow_unused_pollers

SRC = Path(dbos_private.__file__).resolve().parents[1]


def _owner(where: str, built: DBOS) -> Any:
    """The module, class or instance ``where`` names in ``PRIVATE_NAMES``."""
    if where == "DBOS":
        return built
    if where == "dbos.Queue":
        return built._registry.get_internal_queue()
    module, _, rest = where.partition(".")
    found: Any = importlib.import_module(module)
    for part in rest.split(".") if rest else []:
        name = f"{found.__name__}.{part}" if hasattr(found, "__path__") else None
        if name is not None and importlib.util.find_spec(name) is not None:
            found = importlib.import_module(name)
        else:
            found = getattr(found, part)
    return found


@pytest.mark.inprocess
def test_every_private_dbos_name_thoughtgate_uses_is_in_the_installed_dbos() -> None:
    """An upgrade of dbos that renames or removes one fails here, before anyone runs it."""
    built = DBOS(config={"name": "the-application", "system_database_url": "sqlite:///:memory:"})
    try:
        gone = [
            f"{where}.{name}"
            for where, name in dbos_private.PRIVATE_NAMES
            if name not in dir(_owner(where, built))  # dir: a property is not run
        ]
    finally:
        DBOS.destroy()
    assert not gone, f"dbos {dbos_private.dbos_version()} no longer has {gone}: see ADR 0136"


def _private_uses(path: Path) -> list[str]:
    """The private dbos imports in ``path`` (``from dbos._x import``, ``from dbos import _x``,
    ``import dbos._x``, a string that is a private dbos module's name, as ``import_module``
    takes), and its attributes named as a private name of ``PRIVATE_NAMES``."""
    names = {name for _, name in dbos_private.PRIVATE_NAMES if name.startswith("_")}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and re.match(r"dbos\._", node.module or ""):
            found.append(f"{path.name}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Constant) and re.fullmatch(r"dbos\._[\w.]+", str(node.value)):
            found.append(f"{path.name}:{node.lineno} {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module == "dbos":
            found += [f"{path.name}:{node.lineno} {a.name}" for a in node.names if a.name[0] == "_"]
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno}" for a in node.names if a.name[:6] == "dbos._"]
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


@pytest.mark.unit
def test_only_dbos_private_reads_dbos_private_names() -> None:
    here = SRC / "orchestration" / "dbos_private.py"
    others = [p for p in sorted(SRC.rglob("*.py")) if p != here]
    assert others and _private_uses(here)  # the check sees them where they are
    assert [use for path in others for use in _private_uses(path)] == []


@pytest.mark.unit
def test_the_check_sees_each_form_of_private_dbos_use(tmp_path: Path) -> None:
    """Each way a module could name a private dbos name is found; a public one is not."""
    uses = {
        "from dbos._error import DBOSWorkflowConflictIDError": 1,
        "from dbos import _error": 1,
        "import dbos._sys_db": 1,
        "importlib.import_module('dbos._dbos')": 1,
        "instance._sys_db.tables": 1,
        "from dbos import DBOS, error\nerror.DBOSWorkflowConflictIDError": 0,
        "'see dbos._logger.init_logger in its docs'": 0,
    }
    for source, count in uses.items():
        path = tmp_path / "module.py"
        path.write_text(source + "\n", encoding="utf-8")
        assert len(_private_uses(path)) == count, source


@pytest.mark.unit
def test_a_dbos_without_the_conflict_error_fails_the_import_naming_its_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``durable`` catches ``DBOSWorkflowConflictIDError``, read from the public ``dbos.error``
    when ``dbos_private`` is imported (the durable launch): a dbos that moves it fails there with
    the ``RuntimeFailure`` every private name gives, not an ``ImportError`` (or a catch that
    never matches). A fresh copy of the module is loaded, so the real one is left as it is."""
    from dbos import error

    assert dbos_private.DBOSWorkflowConflictIDError is error.DBOSWorkflowConflictIDError
    monkeypatch.delattr(error, "DBOSWorkflowConflictIDError")
    spec = importlib.util.spec_from_file_location("dbos_private_copy", dbos_private.__file__)
    assert spec is not None and spec.loader is not None
    with pytest.raises(RuntimeFailure) as raised:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    said = str(raised.value)
    assert (
        f"dbos {dbos_private.dbos_version()} has no dbos.error.DBOSWorkflowConflictIDError" in said
    )
    assert "durability.enabled = false" in said and "ADR 0136" in said


@pytest.mark.inprocess
def test_a_dbos_without_a_private_name_fails_loudly_naming_its_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slowing DBOS's unused pollers on a dbos without the background jobs' interval raises a
    ``RuntimeFailure`` that names the dbos version, the name and what to do, rather than leave
    the jobs polling every second unsaid; so does reading the running workflows."""
    from dbos import _dbos, _workflow_commands

    monkeypatch.delattr(_workflow_commands, "_BACKGROUND_JOBS_INTERVAL_SEC")
    DBOS(config={"name": "the-application", "system_database_url": "sqlite:///:memory:"})
    try:
        with pytest.raises(RuntimeFailure) as raised:
            slow_unused_pollers(postgres=False)
        said = str(raised.value)
        assert f"dbos {dbos_private.dbos_version()} has no " in said
        assert "dbos._workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC" in said
        assert "durability.enabled = false" in said and "ADR 0136" in said
        monkeypatch.delattr(_dbos, "_get_dbos_instance")
        with pytest.raises(RuntimeFailure, match=r"has no dbos\._dbos\._get_dbos_instance"):
            dbos_private.active_workflows()
    finally:
        monkeypatch.undo()
        DBOS.destroy()
