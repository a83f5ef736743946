"""MkDocs hook: pages made of files that live outside docs/, included as they are so they cannot drift.

A page line of the form ``--8<-- "PATH"`` (PATH relative to the repository root) is replaced by that
file's text. The site uses it for README.md (Home), ARCHITECTURE.md and benchmarks/README.md. A missing
file fails the build. Relative links in the included text are written for the file's own place in the
repository, so they are rewritten for the page's place in the site:

- a link into ``docs/`` points at that page;
- a link to another included file points at the page that includes it (README.md -> Home);
- a link to any other existing file that is not Markdown (the benchmark plots) is published at its
  repository path, so ``benchmarks/README.md``'s ``results/x.png`` works from ``benchmarks/index.md``;
- anything else is left as it is, and ``mkdocs build --strict`` names the broken link.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^--8<-- "([^"]+)"[ \t]*$', re.M)
LINK = re.compile(r"(\]\()([^)\s]+)([^)]*\))")
log = logging.getLogger("mkdocs.hooks.repo_files")

#: page (docs-relative) -> the repository file it includes; filled in on_files.
_included: dict[str, str] = {}


def _source(path: str, page: str) -> Path:
    source = (ROOT / path).resolve()
    if not source.is_file() or ROOT not in source.parents:
        raise PluginError(f"{page} includes {path!r}, which is not a file in the repository")
    return source


def _targets(text: str) -> list[tuple[str, str]]:
    """(link as written, the link's path without its #anchor) for every relative link in ``text``."""
    found = []
    for _, target, _ in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:|^[#/]", target):  # scheme (https:, mailto:), anchor, absolute
            continue
        found.append((target, target.split("#", 1)[0]))
    return found


def _in_repo(included: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(posixpath.dirname(included), path))


def on_files(files: Files, config: Any) -> Files:
    _included.clear()
    for file in list(files.documentation_pages()):
        for path in INCLUDE.findall(Path(file.abs_src_path or "").read_text(encoding="utf-8")):
            _source(path, file.src_uri)
            _included[file.src_uri] = path
    for path in _included.values():
        for _, target in _targets((ROOT / path).read_text(encoding="utf-8")):
            repo_path = _in_repo(path, target)
            if (
                repo_path.startswith(("docs/", "../"))
                or repo_path.endswith(".md")
                or not (ROOT / repo_path).is_file()
                or files.get_file_from_path(repo_path) is not None
            ):
                continue
            files.append(File.generated(config, repo_path, abs_src_path=str(ROOT / repo_path)))
    return files


def _rewrite(text: str, included: str, page: str) -> str:
    pages = {path: p for p, path in _included.items()}

    def link(match: re.Match[str]) -> str:
        opening, target, rest = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:|^[#/]", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_path = _in_repo(included, path)
        if repo_path.startswith("docs/"):
            site_path = repo_path.removeprefix("docs/")
        elif repo_path in pages:
            site_path = pages[repo_path]
        elif (ROOT / repo_path).is_file() and not repo_path.endswith(".md"):
            site_path = repo_path
        else:
            return match.group(0)
        new = posixpath.relpath(site_path, posixpath.dirname(page) or ".")
        return f"{opening}{new}{'#' + anchor if anchor else ''}{rest}"

    return LINK.sub(link, text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def include(match: re.Match[str]) -> str:
        path = match.group(1)
        text = _source(path, page.file.src_uri).read_text(encoding="utf-8")
        return _rewrite(text, path, page.file.src_uri)

    return INCLUDE.sub(include, markdown)
