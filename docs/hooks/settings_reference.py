"""MkDocs hook: the configuration reference, generated from ``agent.settings.Settings`` so it cannot drift.

``docs/configuration.md`` holds the marker ``<!-- settings-reference -->``; this hook replaces it with one
table per part of the settings (``Settings.parts()``: database, model, payments, ...), each preceded by the
part's docstring, and in it one row per field: the environment variable (pydantic-settings reads the field's
alias, or its name, upper-cased), its type as the part declares it, its default, and its description.

The description is the field's ``description`` if it has one, else its attribute docstring (the string
right under the field in ``agent/settings/<part>.py``; the parts do not turn on ``use_attribute_docstrings``,
so the hook reads them from the source). A field with neither is a warning, which fails
``mkdocs build --strict``.

Defaults computed when the service starts (a ``default_factory`` other than an empty dict or list,
e.g. the host name) are shown as "computed at start"; a secret's default is never printed.
"""

from __future__ import annotations

import ast
import inspect
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- settings-reference -->"
log = logging.getLogger("mkdocs.hooks.settings_reference")


def _settings_class() -> type[Any]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from agent.settings import Settings

    return Settings


def declared_fields(cls: type[Any]) -> dict[str, tuple[str, str | None]]:
    """Field name -> (its annotation as written, its attribute docstring) from the class's source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, tuple[str, str | None]] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                doc = inspect.cleandoc(str(after.value.value))
            found[node.target.id] = (ast.unparse(node.annotation), doc)
    return found


def _cell(text: str) -> str:
    return " ".join(text.replace("``", "`").split()).replace("|", "\\|")


def _type(annotation: str) -> str:
    return annotation.removesuffix(" | None")


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f" ({int(seconds // size)} {unit})"
    return ""


def _default(name: str, field: Any, annotation: str) -> str:
    if field.default_factory is not None:
        empty = {dict: "{}", list: "[]"}.get(field.default_factory)
        return f"`{empty}`" if empty else "computed at start"
    value = field.default
    if value is None:
        return "unset"
    if "SecretStr" in annotation:
        return "set (a secret: not shown)"
    if isinstance(value, int | float) and not isinstance(value, bool):
        shown = int(value) if float(value).is_integer() else value
        return f"`{shown}`" + (_duration(value) if name.endswith("_seconds") else "")
    return f"`{value}`"


def part_table(part: type[Any]) -> str:
    """One part's rows."""
    prefix = str(part.model_config.get("env_prefix") or "")
    declared = declared_fields(part)
    rows = ["| environment variable | type | default | description |", "|---|---|---|---|"]
    for name, field in part.model_fields.items():
        annotation, doc = declared.get(name, (str(field.annotation), None))
        text = field.description or doc
        if not text:
            log.warning("settings field %s.%s has no docstring: give it one in agent/settings/", part.__name__, name)
            text = ""
        env = f"{prefix}{field.alias or name}".upper()
        rows.append(f"| `{env}` | `{_type(annotation)}` | {_default(name, field, annotation)} | {_cell(text)} |")
    return "\n".join(rows)


def reference_table() -> str:
    """Every part's table, in the order ``Settings`` holds them, each under its name and what it is for."""
    tables = []
    for name, part in _settings_class().parts().items():
        about = inspect.cleandoc(part.__doc__ or "").split("\n\n")[0]
        tables.append(f"**`settings.{name}`**: {_cell(about)}\n\n{part_table(part)}")
    return "\n\n".join(tables)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != "configuration.md":
        return markdown
    if MARKER not in markdown:
        log.warning("configuration.md has lost its %s marker: the settings table is missing", MARKER)
        return markdown
    # In a div (md_in_html) the stylesheet can find: docs/stylesheets/reference.css keeps names whole.
    table = f'<div class="settings-reference" markdown>\n\n{reference_table()}\n\n</div>'
    return markdown.replace(MARKER, table)
