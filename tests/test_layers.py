"""The import contracts hold: layers, no import circle, and no module left out of the layers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "steps", "sandbox", "proving", "benchmarks")


def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def _graph() -> grimp.ImportGraph:
    sys.path.insert(0, str(ROOT))
    try:
        return grimp.build_graph(*PACKAGES, cache_dir=None)
    finally:
        sys.path.remove(str(ROOT))


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout, run.stdout


def test_no_module_imports_itself_back_through_others() -> None:
    graph = _graph()
    circles = [
        (importer, *back)
        for importer in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(importer))
        if (back := graph.find_shortest_chain(importer=imported, imported=importer))
    ]
    assert circles == [], f"import circles: {circles}"


def test_every_module_of_agent_has_a_place_in_the_layers() -> None:
    layers = _contracts()["layers"]["layers"]
    assert isinstance(layers, list)
    placed = {name.strip() for layer in layers for name in str(layer).split("|")}
    modules = {
        f"agent.{path.stem if path.is_file() else path.name}"
        for path in (ROOT / "agent").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert modules - placed == set(), "modules the layers contract does not place"


def test_the_core_contract_names_every_core_module() -> None:
    contracts = _contracts()
    surface = {"agent.http", "agent.console", "agent.cli"}
    layers = contracts["layers"]["layers"]
    assert isinstance(layers, list)
    placed = {name.strip() for layer in layers for name in str(layer).split("|")}
    core = {name for name in placed if name.startswith("agent.") and name not in surface}
    sources = contracts["core"]["source_modules"]
    assert isinstance(sources, list)
    assert core == set(sources)
