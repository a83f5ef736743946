"""Product code reaches DBOS through its public API only: no private module, no private attribute.

Ruff's banned-api rule (TID251, pyproject.toml) refuses imports of ``dbos._*`` modules; this test also
catches what an import rule cannot see, such as ``DBOS._recover_pending_workflows(...)`` or an attribute
read off an object DBOS returned (``handle._sys_db``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("agent", "steps", "sandbox")


def private_dbos_uses(source: str) -> list[str]:
    """Every ``dbos._x`` import and every ``_x`` attribute read off a name imported from dbos."""
    tree = ast.parse(source)
    from_dbos: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dbos":
            if any(part.startswith("_") for part in node.module.split(".")):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            from_dbos.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dbos":
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
                    from_dbos.add(alias.asname or "dbos")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in from_dbos
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return sorted(found, key=lambda f: int(f.split(":")[0].removeprefix("line ")))


def product_files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def test_the_checker_sees_private_imports_and_attributes() -> None:
    source = (
        "from dbos import DBOS\nimport dbos\nfrom dbos._dbos import _get_dbos_instance\n"
        "DBOS._recover_pending_workflows(['x'])\ndbos._sys_db\nDBOS.resume_workflow('x')\n"
    )
    assert private_dbos_uses(source) == [
        "line 3: from dbos._dbos import ...",
        "line 4: DBOS._recover_pending_workflows",
        "line 5: dbos._sys_db",
    ]


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_product_code_uses_only_the_public_dbos_api(path: Path) -> None:
    assert private_dbos_uses(path.read_text()) == []
