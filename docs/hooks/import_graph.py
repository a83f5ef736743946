"""MkDocs hook: draws the imports between the layers of ARCHITECTURE.md from the code, at build time.

A page that holds the marker ``<!-- import-graph -->`` gets a Mermaid flowchart: one box per entry of the
``layers`` contract in pyproject.toml (top to bottom, as the contract orders them), one arrow per pair of
entries where a module of the first imports a module of the second. Built from the code, it cannot drift.
"""

from __future__ import annotations

import logging
import sys
import tomllib
from pathlib import Path
from typing import Any

import grimp

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- import-graph -->"
log = logging.getLogger("mkdocs.hooks.import_graph")


def layer_entries() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["id"] == "layers")["layers"]
    return [[name.strip() for name in layer.split("|")] for layer in layers]


def owner(module: str, entries: list[str]) -> str | None:
    matches = [e for e in entries if module == e or module.startswith(e + ".")]
    return max(matches, key=len) if matches else None


def edges() -> tuple[list[list[str]], set[tuple[str, str]]]:
    layers = layer_entries()
    entries = [e for layer in layers for e in layer]
    roots = sorted({e.split(".")[0] for e in entries})
    sys.path.insert(0, str(ROOT))
    try:
        graph = grimp.build_graph(*roots, cache_dir=None)
    finally:
        sys.path.remove(str(ROOT))
    found: set[tuple[str, str]] = set()
    for module in graph.modules:
        source = owner(module, entries)
        if source is None:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            target = owner(imported, entries)
            if target is not None and target != source:
                found.add((source, target))
    return layers, found


def mermaid() -> str:
    layers, found = edges()
    node = {e: f"n{i}" for i, e in enumerate(e for layer in layers for e in layer)}
    depth_of = {e: depth for depth, layer in enumerate(layers) for e in layer}
    for a, b in sorted(found):
        if depth_of[b] <= depth_of[a]:  # a warning fails `mkdocs build --strict`
            log.warning("import against the layers: %s imports %s", a, b)
    lines = ["```mermaid", "flowchart TD"]
    for depth, layer in enumerate(layers):
        lines.append(f'  subgraph L{depth} [" "]')
        lines.extend(f'    {node[e]}["{e}"]' for e in layer)
        lines.append("  end")
    ordered = sorted(found, key=lambda edge: (depth_of[edge[0]], depth_of[edge[1]], edge))
    lines.extend(f"  {node[a]} --> {node[b]}" for a, b in ordered)
    lines.append("```")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "architecture.md":
        return markdown
    if MARKER not in markdown:
        log.warning("docs/architecture.md lost its %s marker", MARKER)
        return markdown
    return markdown.replace(MARKER, mermaid())
