"""The documentation: every command it shows runs (here, or in the test or CI script named for it), the
README stays short, and the site builds with ``mkdocs build --strict``.

The convention README.md and docs/**/*.md follow, and this file parses:

* A *typed command* is a line of a fenced block whose info string is ``bash``, ``sh`` or ``shell``. A line
  ending in a backslash goes on on the next one; ``#`` starts a comment. These blocks hold commands only:
  what a command prints goes in a separate ``text`` block.
* A line is split into simple commands at ``&&``, ``||``, ``;``, ``|`` and ``&``; a redirection
  (``> file``) is not part of the command; ``NAME=value`` words in front of the program are.
* ``<anything>`` is a placeholder, ``$NAME`` a shell variable and ``$(...)`` a value the shell computes.
  A command's *normal form* is its words, shell-quoted and joined by spaces, with every placeholder
  written ``<>`` (``dbos workflow fork req-2026-0001/settle --step <> ...``); the tables below use it.
* A line that only sets variables (``NAME=value``, ``export NAME=value ...``) is checked here: every name
  is a setting of ``agent.settings.Settings`` whose value must validate (unless the shell computes it),
  or one of SHELL_VARIABLES, which later lines use.
* Every other simple command must be
  (a) run by this file: every line of a block written right under ``<!-- docs-test: WORLD -->`` runs,
      block after block in the order WORLDS gives, in one fresh directory per world (servers in the
      background, placeholders and ports filled in, a wait where a person would wait); so do the
      commands in SINGLES;
  (b) in RUN_ELSEWHERE, with the test file or CI script that runs it; that file's text must name the
      command's program, its subcommands and every flag it passes, or, where the row says so (the file
      runs it through Python rather than a shell), the words the row gives;
  (c) or in NOT_RUNNABLE_HERE, with the reason it cannot run where the tests run.
* Wherever it runs, a ``refund-agent`` command must parse with the CLI's own parser, a ``dbos`` command
  may only use flags its ``--help`` lists, and a ``docker compose`` command may only name services
  compose.yaml has.
"""

from __future__ import annotations

import itertools
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import web, zygote

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 220
BIN = Path(sys.executable).parent
KEY = "helpdesk-ticket-4711"  # the README's refund
SESSION_KEY = "req-2026-0001"  # the local session's refund

#: The blocks marked ``<!-- docs-test: WORLD -->``, run in this order of files, one world per test below.
WORLDS: dict[str, tuple[str, ...]] = {
    "serve": ("README.md", "docs/console.md"),
    "session": ("docs/getting-started.md", "docs/how-it-works.md", "docs/operations/upgrades.md"),
    "evals": ("docs/evaluations.md",),
}

#: (a) Single commands this file runs as the docs write them, and the test that does.
SINGLES: dict[str, str] = {
    "refund-agent demo": "test_the_demo_runs_as_the_readme_says",
    "refund-agent --help": "test_the_help_commands",
    "refund-agent eval --help": "test_the_help_commands",
    "refund-agent hash-password": "test_hash_password_prints_a_hash",
    "mkdocs build --strict": "test_the_site_builds_strictly",
}

#: Shell variables a docs line sets for the lines after it (not settings).
SHELL_VARIABLES = {"TOKEN"}


@dataclass(frozen=True)
class Elsewhere:
    """Where a command runs, and, when that file runs it through Python, the words that show it does."""

    where: str
    words: tuple[str, ...] = ()
    why: str = ""


_CI_INSTALL = Elsewhere(".ci/run", ("pip install -q -e '.[dev,bench]'",), "CI installs the project editable, with more")
_DBOS_CLI = Elsewhere("tests/test_dbos_cli.py")
_ARGUS = Elsewhere("tests/test_dbos_argus.py", why="on a free loopback port, against the test's system database")
_DRILL = Elsewhere("tests/test_rolling_upgrade.py", ("run_drill(", "workers=", "refunds=", "out="), "small size")

#: (b) Commands a test file or CI script runs.
RUN_ELSEWHERE: dict[str, Elsewhere] = {
    "python3 -m venv .venv": Elsewhere(".ci/run"),
    ". .venv/bin/activate": Elsewhere(".ci/run", (". .venv/bin/activate",)),
    "pip install -e .": _CI_INSTALL,
    "pip install -e '.[dev]'": _CI_INSTALL,
    "pytest": Elsewhere(".ci/run"),
    "apt-get install -y chromium": Elsewhere(".ci/run"),
    "npm ci --prefix docs --no-audit --no-fund": Elsewhere(".ci/run", ("npm ci --prefix docs --no-audit --no-fund",)),
    "refund-agent serve --no-worker": Elsewhere("tests/scale_cluster.py"),
    "python -m proving.rolling_upgrade --postgres-url <> --workers 4 --refunds 400 --out report.json": _DRILL,
    "refund-agent clients add helpdesk --scopes refunds:create,refunds:read --key-file helpdesk.key": Elsewhere(
        "docs/getting-started.md",
        ("refund-agent clients add helpdesk --scopes refunds:create,refunds:read --key-file",),
        "the local session (docs-test: session) runs this very line, with the file in the data directory",
    ),
    "refund-agent clients add approvals-bot --scopes approvals:decide --operator dana --key-file approvals-bot.key": (
        Elsewhere(
            "tests/test_identities.py",
            ('"clients", "add"', '"--scopes"', '"--operator", "dana"', '"--key-file"'),
            "through Python, with another client's name",
        )
    ),
    "refund-agent clients list": Elsewhere("tests/test_identities.py", ('"clients", "list"',), "through Python"),
    "refund-agent clients revoke approvals-bot": Elsewhere(
        "tests/test_identities.py", ('"clients", "revoke"',), "through Python, with another client's name"
    ),
    "openapi-python-client generate --url http://localhost:8000/openapi.json --output-path refund_agent_client "
    "--meta none": Elsewhere("tests/test_generated_client.py", why="against a live service's address, into tmp_path"),
    "dbos workflow list --status DELAYED --name approval_deadline_workflow": _DBOS_CLI,
    "dbos workflow get req-2026-0001/settle": _DBOS_CLI,
    "dbos workflow steps req-2026-0001/settle": _DBOS_CLI,
    "dbos workflow cancel req-2026-0001/settle": _DBOS_CLI,
    "dbos workflow resume req-2026-0001/settle": _DBOS_CLI,
    "dbos workflow fork req-2026-0001/settle --step <> --forked-workflow-id req-2026-0001-retry": _DBOS_CLI,
    "pip install --ignore-requires-python dbos-argus==0.0.41": Elsewhere(".ci/run"),
    "dbos-argus --db-url 'sqlite:///file:/srv/.refund-agent/dbos_system.sqlite?mode=ro&uri=true' --host 127.0.0.1 "
    "--port 8090": _ARGUS,
    "dbos-argus --db-url postgresql://argus_viewer:<>@<>:5432/<> --host 127.0.0.1 --port 8090": _ARGUS,
    "pg_createcluster 15 chaos -p 5433": Elsewhere(
        ".ci/pg-chaos-cluster", ("pg_createcluster", "chaos -p 5433"), "with the Postgres version installed"
    ),
    "refund-agent chaos": Elsewhere(
        "tests/test_chaos.py",
        ("ChaosConfig(", "refunds=40", "kills=5", "run_chaos(config)"),
        "the 40-refund soak with 5 kills, through run_chaos, which `refund-agent chaos` calls",
    ),
    "refund-agent chaos --refunds 400 --kills 40 --seed 2026 --postgres-url "
    "postgresql://postgres@127.0.0.1:5433/postgres --pg-restart 15/chaos --max-seconds 1500 "
    "--settle-seconds 400 --out chaos/verdicts/postgres-400-refunds-seed-2026.json": Elsewhere(
        "tests/test_chaos.py",
        ("run_chaos(config)", "seed=", "postgres_url=", "pg_restart=", "max_seconds=", "settle_seconds=", "out="),
        "the same soak at 40 refunds, with each of these settings, on the private cluster .ci/pg-chaos-cluster makes",
    ),
    "REFUND_AGENT_MODEL=qwen3:8b REFUND_AGENT_MODEL_BASE_URL=http://localhost:11434/v1 refund-agent eval": Elsewhere(
        "tests/test_evals.py",
        ('"REFUND_AGENT_MODEL"', '"REFUND_AGENT_MODEL_BASE_URL"', "main(["),
        "a local OpenAI-compatible server stands in for Ollama",
    ),
}

_NO_DOCKER = "no Docker engine where the tests run; tests/test_docker.py checks compose.yaml and the image's command"
_NO_CLUSTER = "no Kubernetes cluster where the tests run; tests/test_kubernetes_manifests.py validates the manifests"
_BY_HAND = "mutation testing runs by hand or on a schedule (about 40 minutes), never in CI"

#: (c) Commands that cannot run where the tests run, and why.
NOT_RUNNABLE_HERE: dict[str, str] = {
    "REFUND_AGENT_MODEL=openai:gpt-5.2 refund-agent eval": "needs a hosted model, its API key and the internet",
    "docker compose up --build -d": _NO_DOCKER,
    "docker compose run --rm migrate refund-agent seed": _NO_DOCKER,
    "docker compose up -d --scale worker-2=0": _NO_DOCKER,
    "kubectl apply -f deploy/kubernetes/namespace.yaml": _NO_CLUSTER,
    "kubectl -n refund-agent create secret generic refund-agent-secrets --from-env-file=<>": _NO_CLUSTER,
    "kubectl -n refund-agent delete job refund-agent-migrate --ignore-not-found": _NO_CLUSTER,
    "kubectl apply -f deploy/kubernetes/migrate-job.yaml": _NO_CLUSTER,
    "kubectl -n refund-agent wait --for=condition=complete --timeout=600s job/refund-agent-migrate": _NO_CLUSTER,
    "kubectl apply -k deploy/kubernetes": _NO_CLUSTER,
    "kubectl -n refund-agent rollout status deployment/refund-agent-worker": _NO_CLUSTER,
    "pip install -e '.[dev,mutation]'": _BY_HAND,
    "bash tests/mutation/run.sh": _BY_HAND,
    "bash tests/mutation/run.sh tokens": _BY_HAND,
    "python -m tests.screenshots": "renews the pictures in docs/console/ (it writes into the repository): run by hand",
}

SHELL_BLOCKS = {"bash", "sh", "shell"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^<!-- docs-test: ([\w-]+) -->$")
PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>")
SUBSTITUTION = re.compile(r"\$\([^()]*\)")
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
SUBCOMMAND = re.compile(r"^[a-z][a-z-]*$")
HOLE = "\u2039\u203a"  # a placeholder, while a line is split into words
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTIONS = {">", ">>", "<"}
SERVERS = {("refund-agent", "serve"), ("refund-agent", "worker"), ("refund-agent", "sandbox-payments")}


# -- reading the docs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    file: str  # relative to the repository
    line: int
    text: str  # the whole line as written (continuations joined)
    words: tuple[str, ...]  # this simple command's words; placeholders are HOLE
    background: bool
    world: str | None

    @property
    def normal(self) -> str:
        return " ".join(shlex.quote(w.replace(HOLE, "PLACEHOLDER")).replace("PLACEHOLDER", "<>") for w in self.words)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def anatomy(self) -> tuple[list[str], str, list[str], list[str], list[str]]:
        """(variables set in front, program, subcommands, flags, every word after the program)."""
        if self.sets_only:
            return [name for name, _ in self.assignments()], "", [], [], []
        words = list(self.words)
        env = []
        while words and ASSIGNMENT.match(words[0]):
            env.append(words.pop(0).split("=", 1)[0])
        program, rest = words[0], words[1:]
        if program in ("python", "python3") and rest[:1] == ["-m"]:
            program, rest = f"python -m {rest[1]}", rest[2:]
        elif program in ("bash", "sh") and rest:
            program, rest = f"bash {rest[0]}", rest[1:]
        subcommands: list[str] = []
        while rest[len(subcommands) :] and len(subcommands) < 2 and SUBCOMMAND.match(rest[len(subcommands)]):
            subcommands.append(rest[len(subcommands)])
        flags = sorted({w.split("=", 1)[0] for w in rest if w.startswith("-") and len(w) > 1})
        return env, program, subcommands, flags, rest

    @property
    def sets_only(self) -> bool:
        words = self.words[1:] if self.words[:1] == ("export",) else self.words
        return all(ASSIGNMENT.match(w) for w in words)

    def assignments(self) -> list[tuple[str, str]]:
        words = self.words[1:] if self.words[:1] == ("export",) else self.words
        found = [ASSIGNMENT.match(w) for w in words]
        return [(m.group(1), m.group(2)) for m in found if m]


def split(text: str) -> list[tuple[list[str], bool]]:
    """A line's simple commands: (words, whether it runs in the background)."""
    prepared = PLACEHOLDER.sub(HOLE, SUBSTITUTION.sub("$(...)", text))
    lexer = shlex.shlex(prepared, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    tokens = list(lexer)
    found: list[tuple[list[str], bool]] = []
    words: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in SEPARATORS:
            if words:
                found.append((words, token == "&"))
            words = []
        elif token in REDIRECTIONS:
            skip = True
        else:
            words.append(token)
    if words:
        found.append((words, False))
    return found


def doc_files() -> list[Path]:
    return [README, *sorted(p for p in (ROOT / "docs").rglob("*.md") if "node_modules" not in p.parts)]


def blocks(path: Path) -> Iterator[tuple[int, str, str | None, list[tuple[int, str]]]]:
    """(line of the opening fence, info string, docs-test world, body lines) of each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening.group(1)
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        marker = MARKER.match(lines[i - 1].strip()) if i else None
        body = []
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            body.append((j + 1, lines[j]))
            j += 1
        yield i + 1, opening.group(2).lower(), marker.group(1) if marker else None, body
        i = j + 1


@cache
def doc_commands() -> tuple[Command, ...]:
    found = []
    for path in doc_files():
        relative = path.relative_to(ROOT).as_posix()
        for _, info, world, body in blocks(path):
            if info not in SHELL_BLOCKS:
                continue
            logical: list[tuple[int, str]] = []
            for number, text in body:
                if logical and logical[-1][1].endswith("\\"):
                    logical[-1] = (logical[-1][0], logical[-1][1][:-1] + " " + text.strip())
                else:
                    logical.append((number, text.rstrip()))
            for number, text in logical:
                if not text.strip() or text.strip().startswith("#"):
                    continue
                for words, background in split(text):
                    found.append(Command(relative, number, text.strip(), tuple(words), background, world))
    return tuple(found)


def documented(normal: str) -> list[Command]:
    return [c for c in doc_commands() if c.normal == normal]


def world_commands(world: str) -> list[Command]:
    order = {file: i for i, file in enumerate(WORLDS[world])}
    return sorted((c for c in doc_commands() if c.world == world), key=lambda c: (order[c.file], c.line))


def settings_names() -> dict[str, str]:
    """Environment variable -> settings field."""
    from agent.settings import Settings

    return {variable.upper(): ".".join(where) for variable, where in Settings.variables().items()}


# -- the tables are honest and complete ------------------------------------------------------------------


def _named(text: str, word: str, python: bool) -> bool:
    if python:
        return f'"{word}"' in text or f"'{word}'" in text
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def _evidence_missing(command: Command, place: Elsewhere) -> list[str]:
    path = ROOT / place.where
    if not path.is_file():
        return [f"{place.where} does not exist"]
    text = path.read_text(encoding="utf-8")
    if place.words:
        return [w for w in place.words if w not in text]
    env, program, subcommands, flags, _ = command.anatomy()
    python = path.suffix == ".py"
    aliases = {
        "refund-agent": ("refund-agent", "agent.cli"),
        "dbos": ('"dbos"', "dbos "),
    }.get(program, (f'"{program[10:]}"', f"-m {program[10:]}") if program.startswith("python -m ") else (program,))
    missing = [] if any(a in text for a in aliases) else [program]
    missing += [w for w in [*subcommands, *flags] if not _named(text, w, python)]
    return missing + [name for name in env if name not in text]


def test_every_command_is_run_here_or_named_with_where_it_runs() -> None:
    in_worlds = {c.normal for c in doc_commands() if c.world}
    problems = []
    for command in doc_commands():
        if command.sets_only or command.world or command.normal in in_worlds or command.normal in SINGLES:
            continue
        if command.normal in NOT_RUNNABLE_HERE:
            continue
        place = RUN_ELSEWHERE.get(command.normal)
        if place is None:
            problems.append(
                f"{command.where}: `{command.normal}` is not run by tests/test_docs.py, and neither RUN_ELSEWHERE "
                "nor NOT_RUNNABLE_HERE names it: run it in a docs-test block or a test, or add it to a table"
            )
            continue
        missing = _evidence_missing(command, place)
        if missing:
            problems.append(f"{command.where}: `{command.normal}`: {place.where} does not contain {missing}")
    assert not problems, "\n".join(problems)


def test_the_tables_name_only_commands_the_docs_show() -> None:
    shown = {c.normal for c in doc_commands()}
    stale = sorted((set(SINGLES) | set(RUN_ELSEWHERE) | set(NOT_RUNNABLE_HERE)) - shown)
    assert not stale, f"no doc shows these any more; drop them from the tables: {stale}"
    assert not set(RUN_ELSEWHERE) & set(NOT_RUNNABLE_HERE)


def test_docs_test_markers_name_known_worlds_on_shell_blocks() -> None:
    marked: dict[str, set[str]] = {}
    for path in doc_files():
        relative = path.relative_to(ROOT).as_posix()
        for line, info, world, _ in blocks(path):
            if world is None:
                continue
            assert world in WORLDS, f"{relative}:{line}: unknown docs-test world {world!r}"
            assert info in SHELL_BLOCKS, f"{relative}:{line}: a docs-test block must be a shell block"
            marked.setdefault(world, set()).add(relative)
    assert {w: set(files) for w, files in WORLDS.items()} == marked
    for command in doc_commands():
        if command.world:
            assert len(split(command.text)) == 1, f"{command.where}: one command per line in docs-test blocks"


def test_lines_that_set_variables_set_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.settings import Settings

    names = settings_names()
    problems = []
    for command in doc_commands():
        pairs = command.assignments() if command.sets_only else [(n, "") for n in command.anatomy()[0]]
        for name, value in pairs:
            if name in SHELL_VARIABLES:
                continue
            if name not in names:
                problems.append(f"{command.where}: {name} is not a setting (agent/settings/) nor a shell variable")
                continue
            if command.sets_only and "$(" not in value and HOLE not in value:
                with monkeypatch.context() as patched:
                    patched.setenv(name, value)
                    try:
                        Settings(_env_file=None)
                    except ValueError as error:
                        problems.append(f"{command.where}: {name}={value} does not validate: {error}")
    assert not problems, "\n".join(problems)


def test_refund_agent_commands_parse_with_the_cli_parser() -> None:
    from agent.cli import parser

    eval_help = run([str(BIN / "refund-agent"), "eval", "--help"]).stdout
    problems = []
    for command in doc_commands():
        _, program, subcommands, flags, rest = command.anatomy()
        if program != "refund-agent" or "--help" in rest:
            continue
        if subcommands[:1] == ["eval"]:
            problems += [f"{command.where}: eval has no {f}" for f in flags if not _named(eval_help, f, False)]
            continue
        try:
            parser().parse_args([w.replace(HOLE, "x") for w in rest])
        except SystemExit:
            problems.append(f"{command.where}: `{command.normal}` does not parse (see the usage above)")
    assert not problems, "\n".join(problems)


def test_dbos_commands_use_flags_the_dbos_cli_has() -> None:
    helps: dict[str, str] = {}
    problems = []
    for command in doc_commands():
        _, program, subcommands, flags, _ = command.anatomy()
        if program != "dbos":
            continue
        name = " ".join(subcommands)
        if name not in helps:
            helps[name] = run([str(BIN / "dbos"), *subcommands, "--help"]).stdout
        problems += [f"{command.where}: `dbos {name}` has no {f}" for f in flags if not _named(helps[name], f, False)]
    assert helps and not problems, "\n".join(problems)


def test_docker_compose_commands_name_services_compose_yaml_has() -> None:
    services = set(yaml.safe_load((ROOT / "compose.yaml").read_text())["services"])
    named = []
    for command in doc_commands():
        words = list(command.words)
        if words[:2] != ["docker", "compose"]:
            continue
        if "run" in words:
            named.append(next(w for w in words[words.index("run") + 1 :] if not w.startswith("-")))
        named += [w.split("=")[0] for prev, w in itertools.pairwise(words) if prev == "--scale"]
    assert named and set(named) <= services, (named, services)


def test_the_readme_demo_sample_agrees_with_what_the_readme_says_of_it() -> None:
    """The sample output's numbers fall within the ones the sentence above it quotes."""
    text = README.read_text(encoding="utf-8")
    quoted = re.search(r"\((\d+) checks, in ([\d.]+)-([\d.]+) s by the time it prints", text)
    sample = re.search(r"^(\d+)/(\d+) checks passed in ([\d.]+)s$", text, re.M)
    assert quoted and sample, "the README quotes the demo's checks and times, and shows its last line"
    checks, low, high = int(quoted[1]), float(quoted[2]), float(quoted[3])
    assert int(sample[1]) == int(sample[2]) == checks
    assert low <= float(sample[3]) <= high, (sample[0], quoted[0])
    stamps = [float(s) for s in re.findall(r"^\[\s*([\d.]+)s\]", text, re.M)]
    assert stamps and stamps == sorted(stamps) and stamps[-1] <= float(sample[3]), stamps


def test_the_readme_says_what_to_run_before_building_the_site() -> None:
    """`mkdocs build --strict` fails until the site's Mermaid is installed: wherever the README names the build,
    the same paragraph names that step first."""
    text = README.read_text(encoding="utf-8")
    builds = [m.start() for m in re.finditer(r"mkdocs build", text)]
    assert builds
    for at in builds:
        paragraph = text[text.rfind("\n\n", 0, at) : at]
        assert "npm ci --prefix docs" in paragraph, paragraph


def test_a_site_build_without_its_mermaid_says_what_to_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("mermaid_local", ROOT / "docs" / "hooks" / "mermaid_local.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    monkeypatch.setattr(hook, "ROOT", tmp_path)
    monkeypatch.setattr(hook, "SOURCE", tmp_path / "docs" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js")
    warned: list[str] = []
    monkeypatch.setattr(hook.log, "warning", lambda message, *args: warned.append(message % args))
    hook.on_config(SimpleNamespace(extra_javascript=[]))
    [message] = warned
    assert "run `npm ci --prefix docs --no-audit --no-fund` from the repository root" in message, message


def test_the_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move the rest to docs/"


# -- running them --------------------------------------------------------------------------------------


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=kwargs.pop("timeout", 180), **kwargs)
    # A long output loses its start to the cut below: the demo's failed checks are named there, so they come first.
    failed = "\n".join(line for line in done.stdout.splitlines() if line.lstrip().startswith("FAIL"))
    assert done.returncode == 0, (
        f"{args} exited {done.returncode}\n{failed}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any setting, so a command sees the embedded default, plus ``extra``. On its PATH
    ``refund-agent`` is forked from the suite's warm launcher (tests/warm_command.py: the same command line, without
    two seconds of imports per line); tests/test_startup_output.py and tests/test_tools.py start it cold."""
    settings = set(settings_names())
    env = {k: v for k, v in os.environ.items() if k.upper() not in settings and not k.startswith(("DBOS_", "REFUND_"))}
    warm = zygote.command_dir()
    env["PATH"] = os.pathsep.join([*([str(warm)] if warm else []), str(BIN), env.get("PATH", "")])
    return {**env, **extra}


def wait_for(check: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class World:
    """One directory in which a docs-test world's lines run, as a person would type them there."""

    def __init__(self, path: Path, **env: str) -> None:
        self.cwd = path
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.env = clean_env(**env)
        self.servers: dict[str, subprocess.Popen[bytes]] = {}
        self.preamble: list[str] = []  # earlier lines that set shell variables

    def start(self, command: Command) -> bool:
        """Start a server line once, in the background; False if it is not one."""
        _, program, subcommands, _, _ = command.anatomy()
        if not command.background and (program, *subcommands[:1]) not in SERVERS:
            return False
        if command.normal not in self.servers:
            log = (self.cwd / "logs").resolve()
            log.mkdir(exist_ok=True)
            with (log / f"{len(self.servers)}.log").open("ab") as out:
                self.servers[command.normal] = subprocess.Popen(
                    ["bash", "-c", command.normal],
                    cwd=self.cwd,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop() ends it and its children
                )
        return True

    def run(self, command: Command, text: str, timeout: float = 180) -> str:
        holes = [w for words, _ in split(text) for w in words if HOLE in w]
        assert not holes, f"{command.where}: this test has nothing to put for the placeholder in {text}"
        done = subprocess.run(
            ["bash", "-c", "\n".join([*self.preamble, text])],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{command.where}: `{text}` exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        if command.sets_only:
            self.preamble.append(text)
        return done.stdout

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((self.cwd / "logs").glob("*.log")))

    def stop(self) -> None:
        for process in reversed(list(self.servers.values())):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.servers.values():
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def _row_status(cwd: Path, refund_id: str) -> str | None:
    database = cwd / ".refund-agent" / "refund_agent.sqlite"
    if not database.exists():
        return None
    with sqlite3.connect(database) as conn:
        row = conn.execute("SELECT status FROM refunds WHERE refund_id = ?", (refund_id,)).fetchone()
    return None if row is None else str(row[0])


def _has_status(cwd: Path, refund_id: str, status: str) -> Callable[[], bool]:
    return lambda: _row_status(cwd, refund_id) == status


def test_the_readme_api_walk_through_runs_against_a_real_server(tmp_path: Path) -> None:
    """README's `refund-agent serve` and curl lines, and the console's set-up lines, on the embedded default."""
    port, sandbox = free_port(), free_port()
    world = World(tmp_path, REFUND_AGENT_PORT=str(port), PAYMENTS_SANDBOX_PORT=str(sandbox))
    base = f"http://127.0.0.1:{port}"

    def refund(status: str) -> dict[str, Any] | None:
        token = (world.cwd / ".refund-agent" / "api_token").read_text().strip()
        found = web.get(f"{base}/refunds/{KEY}", headers={"Authorization": f"Bearer {token}"}).json()
        return found if found.get("status") == status else None

    def ready() -> bool:
        assert all(p.poll() is None for p in world.servers.values()), world.logs()
        try:
            return web.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    outputs: list[tuple[str, str]] = []
    try:
        for command in world_commands("serve"):
            if world.start(command):
                wait_for(ready, timeout=120, what="refund-agent serve to be ready")
                continue
            text = command.text.replace("localhost:8000", f"localhost:{port}")
            if text.startswith("refund-agent approve") or text.endswith(
                f'/refunds/{KEY} -H "Authorization: Bearer $TOKEN"'
            ):
                # as a person waits for the refund to park ("a moment later")
                wait_for(lambda: refund("awaiting_approval"), timeout=60, what="the refund to park")
            if "status=completed" in text:
                wait_for(lambda: refund("completed"), timeout=60, what="the refund to complete")
            outputs.append((text, world.run(command, text)))
        log = world.logs()
    finally:
        world.stop()
    by_path = {re.sub(r".*localhost:\d+(\S*).*", r"\1", text.split("\n")[0]).strip("\"'"): out for text, out in outputs}
    assert any(o["order_id"] == "ord_1002" for o in json.loads(by_path["/orders?limit=5"])["items"])
    submitted = json.loads(by_path["/refunds"])
    assert submitted["refund_id"] == KEY and submitted["status_url"] == f"/refunds/{KEY}", submitted
    assert submitted["status"] in ("received", "deciding", "awaiting_approval"), submitted
    waiting = json.loads(by_path[f"/refunds/{KEY}"])
    assert waiting["requested_by"] == "client:default" and "token" not in waiting["approval"], waiting
    decided = by_path[f"refund-agent approve {KEY}"]
    me = pwd.getpwuid(os.getuid()).pw_name  # the command line decides as its real user
    assert decided.startswith(f"approve by cli:{me} at ") and "for 4200.00 USD" in decided, decided
    listed = json.loads(by_path["/refunds?status=completed&limit=20"])["items"]
    assert [(r["refund_id"], r["status"], r["amount"]) for r in listed] == [(KEY, "completed", "4200.00")]
    password = next(out for text, out in outputs if "console_admin_password" in text).strip()
    assert password and password not in log
    assert "no operators configured; sign in at /console as 'admin' with the password in" in log


def test_the_local_session_and_the_upgrade_commands_run(tmp_path: Path) -> None:
    """Getting started's session, then how-it-works' and the upgrade page's dbos lines against its databases."""
    from agent import __version__

    world = World(
        tmp_path,
        PAYMENTS_SANDBOX_PORT=str(free_port()),
        DBOS_SYSTEM_DATABASE_URL=f"sqlite:///{tmp_path.resolve()}/.refund-agent/dbos_system.sqlite",
    )
    shutil.copy(ROOT / "dbos-config.yaml", world.cwd / "dbos-config.yaml")
    (world.cwd / ".refund-agent").mkdir()  # where DBOS_SYSTEM_DATABASE_URL points (the upgrade page's `-s`)
    fills = {"<old>": __version__, "<new>": __version__, "<workflow id>": f"{SESSION_KEY}/settle"}
    forked: str | None = None
    try:
        for command in world_commands("session"):
            if world.start(command):
                continue
            _, program, subcommands, flags, _ = command.anatomy()
            text = command.text
            wanted = {"approve": "awaiting_approval", "steps": "completed"}.get(subcommands[0] if subcommands else "")
            if wanted:  # as a person waits for the refund to park, or to be paid, before the next command
                wait_for(_has_status(world.cwd, SESSION_KEY, wanted), timeout=90, what=f"it to be {wanted}")
            for placeholder, value in fills.items():
                text = text.replace(placeholder, value)
            out = world.run(command, text)
            if program == "dbos" and subcommands == ["workflow", "list"]:
                listed = [w["workflow_id"] for w in json.loads(out)]
                assert listed == [] if "--status" in flags else SESSION_KEY in listed, (text, listed)
            if program == "dbos" and subcommands == ["workflow", "steps"]:
                steps = {s["function_name"]: s["function_id"] for s in json.loads(out)}
                fills["<n>"] = str(steps["payments.issue_refund"])
            if program == "dbos" and subcommands == ["workflow", "fork"]:
                forked = json.loads(out)["workflow_id"]
        assert forked, "the upgrade page forks the paying workflow"
        ledger = f"http://127.0.0.1:{world.env['PAYMENTS_SANDBOX_PORT']}/v1/refunds"

        def fork_done() -> bool:
            got = json.loads(run(["dbos", "workflow", "get", str(forked)], cwd=world.cwd, env=world.env).stdout)
            assert got["status"] in ("ENQUEUED", "PENDING", "SUCCESS"), got
            return bool(got["status"] == "SUCCESS")

        wait_for(fork_done, timeout=90, what="the forked workflow to finish")
        answer = web.get(ledger, params={"charge": "ch_ord_1002"}, headers={"Authorization": "Bearer sk_test"})
        held = answer.raise_for_status().json()["data"]
        assert len(held) == 1, held  # the fork sent the same idempotency key: the provider replayed
    except AssertionError as error:
        raise AssertionError(f"{error}\n{world.logs()}") from error
    finally:
        world.stop()


def test_the_evaluation_commands_run(tmp_path: Path) -> None:
    world = World(tmp_path)
    (world.cwd / "evals").mkdir()
    shutil.copy(ROOT / "evals" / "baseline-offline.json", world.cwd / "evals" / "baseline-offline.json")
    for command in world_commands("evals"):
        text = command.text
        if "<A>" in text:
            first, second = sorted((world.cwd / "evals" / "results").glob("*.json"))[:2]
            text = text.replace("<A>", first.stem).replace("<B>", second.stem)
        world.run(command, text)
        time.sleep(1.1)  # each run's report is named after the second it ran in
    assert "|" in (world.cwd / "compare.md").read_text()


def _single(normal: str) -> list[str]:
    assert documented(normal), f"no doc shows `{normal}` any more: drop it from SINGLES"
    return list(documented(normal)[0].words)


def test_the_demo_runs_as_the_readme_says(tmp_path: Path) -> None:
    done = run(_single("refund-agent demo"), cwd=tmp_path, env=clean_env(), timeout=240)
    assert "FAIL" not in done.stdout and "checks passed" in done.stdout, done.stdout
    quoted = re.search(r"\((\d+) checks, in", README.read_text(encoding="utf-8"))
    assert quoted and f"{quoted[1]}/{quoted[1]} checks passed in" in done.stdout  # as many checks as it says


def test_the_help_commands() -> None:
    for normal in ("refund-agent --help", "refund-agent eval --help"):
        assert "usage:" in run(_single(normal), env=clean_env()).stdout


def test_hash_password_prints_a_hash() -> None:
    done = run(_single("refund-agent hash-password"), input="correct horse battery\n", env=clean_env())
    assert done.stdout.startswith("scrypt$")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """The docs' own build command, into a temporary directory; a warning fails it (``--strict``)."""
    quiet = {**clean_env(), "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2.0
    if not (ROOT / "docs" / "node_modules" / "mermaid").exists():  # CI runs `npm ci --prefix docs` first
        npm_ci = ["npm", "ci", "--prefix", str(ROOT / "docs"), "--no-audit", "--no-fund"]
        subprocess.run(npm_ci, check=True, timeout=300)
    run([*_single("mkdocs build --strict"), "-d", str(tmp_path)], cwd=ROOT, env=quiet)
    reference = (tmp_path / "configuration" / "index.html").read_text()
    missing = [name for name in settings_names() if f"<code>{name}</code>" not in reference]
    assert not missing, f"the configuration page lacks {missing}"
    home = (tmp_path / "index.html").read_text()
    assert "How a refund flows" in home and 'href="getting-started/"' in home  # README, its links made the site's
    assert (tmp_path / "benchmarks" / "results").is_dir()  # benchmarks/README.md's plots are published
    _loads_nothing_from_outside(tmp_path)


OUTSIDE = re.compile(r"""<(?:script|link)\b[^>]*?\b(?:src|href)=["']((?:https?:)?//[^"']+)["']""", re.IGNORECASE)


def _loads_nothing_from_outside(site: Path) -> None:
    """Every page's scripts and styles are the site's own (diagrams draw offline); Mermaid is bundled."""
    pages = list(site.rglob("*.html"))
    loaded = {f"{page.relative_to(site)}: {url}" for page in pages for url in OUTSIDE.findall(page.read_text())}
    assert not loaded, f"pages load from outside the site: {sorted(loaded)[:5]}"
    mermaid = site / "assets" / "javascripts" / "mermaid.min.js"
    assert mermaid.stat().st_size > 1_000_000, "the site's Mermaid is missing (npm ci --prefix docs)"
    architecture = (site / "architecture" / "index.html").read_text()
    assert 'class="mermaid"' in architecture and "mermaid.min.js" in architecture
    reference = (site / "configuration" / "index.html").read_text()
    assert 'class="settings-reference"' in reference  # docs/stylesheets/reference.css keeps names whole there
