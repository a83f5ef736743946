"""MkDocs hook: the site serves its own Mermaid, so diagrams draw without internet.

Material for MkDocs loads Mermaid from a CDN unless a global ``mermaid`` is already on the page. This hook
adds ``assets/javascripts/mermaid.min.js`` to the pages and copies it into the site from the npm package
pinned in ``docs/package.json`` (``npm ci --prefix docs``). Without that package the build warns, which
fails ``mkdocs build --strict``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "docs" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
TARGET = "assets/javascripts/mermaid.min.js"
log = logging.getLogger("mkdocs.hooks.mermaid_local")


def on_config(config: Any) -> Any:
    if TARGET not in [str(script) for script in config.extra_javascript]:
        config.extra_javascript.append(TARGET)
    if not SOURCE.exists():
        log.warning(
            "the Mermaid the site serves (%s) is not installed: run `npm ci --prefix docs --no-audit --no-fund` "
            "from the repository root once, then build again (docs/package.json pins it; without it the "
            "diagrams would draw nothing)",
            SOURCE.relative_to(ROOT),
        )
    return config


def on_post_build(config: Any) -> None:
    if SOURCE.exists():
        target = Path(config.site_dir) / TARGET
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SOURCE, target)
