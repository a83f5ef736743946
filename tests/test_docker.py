"""The Dockerfile: linted with hadolint, and its entry command run from a clean virtualenv built the same way.

No Docker engine runs here, so the image is approximated faithfully where it matters: the files its
COPY lines name, a non-editable install of ``.`` into a fresh virtualenv (by uv, which installs what pip would),
the ENV it sets, its exec-form CMD, and its HEALTHCHECK command, which must pass against the running process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.ops.processes import free_port, wait_for
from tests import web
from tests.conftest import BACKENDS, Env

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "docker-entry-token-at-least-32-bytes-long"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_dockerfile_installs_dependencies_before_code_and_runs_unprivileged() -> None:
    steps = instructions()
    kinds = [kind for kind, _ in steps]
    assert steps[0][0] == "FROM" and steps[0][1].endswith("-slim")
    first_code_copy = next(i for i, (k, a) in enumerate(steps) if k == "COPY" and a.startswith("agent"))
    dependency_install = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and "pip install" in a)
    assert dependency_install < first_code_copy
    user = dict(steps)["USER"]
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
    assert "/healthz" in dict(steps)["HEALTHCHECK"]
    json.loads(dict(steps)["CMD"])  # exec form: the process gets SIGTERM itself, not a shell


def build_like_the_dockerfile(workdir: Path) -> Path:
    """The COPY'd files in a fresh directory, installed (not editable) into a fresh virtualenv."""
    app = workdir / "app"
    app.mkdir(parents=True)
    for kind, args in instructions():
        if kind != "COPY":
            continue
        *sources, _ = args.split()
        for source in sources:
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, app / source, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(ROOT / source, app / source)
    venv = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # uv installs what pip would (the package, not editable, and the dependencies pyproject declares) from its cache
    # in seconds; pip takes a minute or more on this suite's machine.
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    install = [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "."]
    subprocess.run(install, cwd=app, check=True, timeout=600)
    return venv


@pytest.mark.skipif("postgres" not in BACKENDS, reason="REFUND_AGENT_TEST_POSTGRES_URL=off")
@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_image_command_serves_health_and_refunds_then_stops_cleanly_on_sigterm(env: Env, tmp_path: Path) -> None:
    venv = build_like_the_dockerfile(tmp_path / "image")
    steps = instructions()
    image_env = {}
    for kind, args in steps:
        if kind == "ENV":
            image_env.update(dict(pair.split("=", 1) for pair in args.split()))
    port = free_port()
    process_env = {
        **image_env,
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "REFUND_AGENT_DATA_DIR": str(tmp_path / "data"),  # the image's /app/.refund-agent
        "REFUND_AGENT_HOST": "127.0.0.1",
        "REFUND_AGENT_PORT": str(port),
        "DBOS_SYSTEM_DATABASE_URL": env.dbs.system_url,
        "DATABASE_URL": env.dbs.app_url,
        "PAYMENTS_API_BASE": env.sandbox.base_url,
        "PAYMENTS_API_KEY": "sk_test_suite",
        "REFUND_AGENT_API_TOKEN": TOKEN,
        "REFUND_AGENT_EXECUTOR_ID": "image-entry",
    }
    seeded = subprocess.run(
        [str(venv / "bin" / "refund-agent"), "seed"], env=process_env, cwd=tmp_path, capture_output=True, check=False
    )
    assert seeded.returncode == 0, seeded.stderr
    log = (tmp_path / "image.log").open("wb")
    command = json.loads(dict(steps)["CMD"])
    proc = subprocess.Popen(command, env=process_env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        health = json.loads(dict(steps)["HEALTHCHECK"].split(" CMD ", 1)[1])

        def healthy() -> bool:
            assert proc.poll() is None, (tmp_path / "image.log").read_text()
            probe = subprocess.run(health, env=process_env, capture_output=True, check=False, timeout=10)
            return probe.returncode == 0

        wait_for(healthy, timeout=120, what="the image's HEALTHCHECK to pass", interval=0.5)
        api = web.client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"})
        body = {"order_id": "ord_1001", "message": "Broken, please refund 5.00", "amount": "5.00"}
        created = api.post("/refunds", json=body, headers={"Idempotency-Key": "image-refund-1"})
        assert created.status_code == 202, created.text

        def completed() -> bool:
            return bool(api.get("/refunds/image-refund-1").json()["status"] == "completed")

        wait_for(completed, timeout=90, what="the refund to complete", interval=0.25)
        assert api.get("/metrics").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert wait_for(proc.poll, timeout=60, what="the process to exit") == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = (tmp_path / "image.log").read_text()
    assert "Traceback" not in output, output
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert lines, output  # REFUND_AGENT_LOG_FORMAT=json from the image's ENV
    assert any(line.get("refund_id") == "image-refund-1" for line in lines), output
    assert not any(TOKEN in line for line in output.splitlines())
    assert os.path.exists(venv / "bin" / "refund-agent")


def test_compose_runs_an_api_and_two_workers_with_their_own_executor_ids() -> None:
    import yaml

    from agent.cli import parser

    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    commands = {name: svc["command"] for name, svc in services.items() if "command" in svc}
    for name, command in commands.items():
        assert command[0] == "refund-agent", name
        parser().parse_args(command[1:])  # every command is one the CLI accepts
    assert commands["api"] == ["refund-agent", "serve", "--no-worker"]
    workers = [name for name, command in commands.items() if command[1:] == ["worker"]]
    assert len(workers) == 2
    ids = [services[name]["environment"]["REFUND_AGENT_EXECUTOR_ID"] for name in [*workers, "api"]]
    assert len(set(ids)) == 3
    for name in [*workers, "api"]:
        env = services[name]["environment"]
        assert env["DBOS_SYSTEM_DATABASE_URL"].startswith("postgresql://")
        assert env["DATABASE_URL"].startswith("postgresql://")
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
