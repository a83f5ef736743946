"""deploy/kubernetes: every manifest valid against the Kubernetes API schemas, and true to the service it runs.

The schemas come bundled with ``kubernetes-validate`` (no download), checked strictly, so a misspelt field fails as
well as a wrong type. What no schema can know is checked against the code: probe paths are routes of the FastAPI
app, every variable is a setting, secrets come from the Secret only, commands are real ``refund-agent``
commands, and the grace period leaves room for the drain the service actually does on SIGTERM.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import SecretStr

from agent.cli import parser
from agent.http.server import HTTP_SHUTDOWN_TIMEOUT_SECONDS, create_app
from agent.settings import Settings
from agent.settings.runtime import RuntimeSettings
from tests.test_docker import instructions

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy" / "kubernetes"
#: The oldest and the newest Kubernetes the manifests are checked against (both bundled in the validator).
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
#: Settings that carry a credential without being typed as one: the database URLs hold the password.
CREDENTIAL_URLS = {"DATABASE_URL", "DBOS_SYSTEM_DATABASE_URL"}
#: What a stop costs besides the workflows' drain: DBOS waits in whole seconds and joins its threads, the lease is
#: released, uvicorn closes its connections. Generous on purpose: running out of grace is a SIGKILL mid-step.
TEARDOWN_ALLOWANCE_S = 10
POD_KINDS = ("Deployment", "Job")


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (p.name, doc) for p in sorted(MANIFESTS.glob("*.yaml")) if p.name != "kustomization.yaml" for doc in load(p)
    ]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def pods() -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, pod spec) of every Deployment and Job."""
    for _, doc in documents():
        if doc["kind"] in POD_KINDS:
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def setting_names() -> set[str]:
    return {name.upper() for name in Settings.variables()}


def secret_settings() -> set[str]:
    """Settings typed as secrets (``SecretStr``, optional or not), and the URLs that carry a password."""
    found = set(CREDENTIAL_URLS)
    parts = Settings.parts()
    for name, (part, field_name) in Settings.variables().items():
        annotation = parts[part].model_fields[field_name].annotation
        members = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
        if SecretStr in members:
            found.add(name.upper())
    return found


def config_map() -> dict[str, str]:
    data: dict[str, str] = one("ConfigMap", "refund-agent-config")["data"]
    return data


def container_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_kubernetes_strictly(version: str) -> None:
    docs = documents()
    assert {doc["kind"] for _, doc in docs} >= {
        "Namespace", "ServiceAccount", "ConfigMap", "Secret", "Job", "Deployment", "Service", "PodDisruptionBudget",
    }  # fmt: skip
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(f"{name} {doc['kind']} {doc['metadata']['name']}: {error.message}") from error


def test_kustomization_names_every_manifest_but_the_secret_example_and_the_job() -> None:
    kustomization = load(MANIFESTS / "kustomization.yaml")[0]
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk - {"secret.example.yaml", "migrate-job.yaml"}
    namespace = one("Namespace", "refund-agent")["metadata"]["name"]
    assert kustomization["namespace"] == namespace
    assert {doc["metadata"].get("namespace") for _, doc in documents() if doc["kind"] != "Namespace"} == {namespace}


def test_probes_ask_the_service_on_paths_and_ports_it_serves() -> None:
    routes = {getattr(route, "path", None) for route in create_app(Settings()).routes}
    for workload, pod in pods():
        for container in pod["containers"]:
            command = parser().parse_args(container["command"][1:])
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            env = container_env(container)
            probes = [container.get(p) for p in ("startupProbe", "readinessProbe", "livenessProbe")]
            if command.command == "migrate":
                assert probes == [None, None, None], workload
                continue
            assert all(probes), f"{workload}: startup, readiness and liveness probes"
            for probe in probes:
                get = probe["httpGet"]
                assert ports[get["port"]], (workload, get)
                if command.command == "serve":
                    # The API: the FastAPI app's own routes, on the port it listens on.
                    assert get["path"] in routes, (workload, get["path"], sorted(r for r in routes if r))
                    assert env["REFUND_AGENT_PORT"]["value"] == str(ports[get["port"]])
                else:
                    # A worker: the metrics server it starts once DBOS launched, on the port it is told.
                    assert command.command == "worker", workload
                    assert env["REFUND_AGENT_METRICS_PORT"]["value"] == str(ports[get["port"]])
            api = one("Deployment", "refund-agent-api")["spec"]["template"]["spec"]["containers"][0]
            assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_every_variable_is_a_setting() -> None:
    known = setting_names()
    named = set(config_map()) | set(one("Secret", "refund-agent-secrets")["stringData"])
    for _, pod in pods():
        for container in pod["containers"]:
            named |= set(container_env(container))
    assert named - known == set()


def test_secrets_come_from_the_secret_only() -> None:
    secrets = secret_settings()
    assert {"REFUND_AGENT_API_TOKEN", "APPROVAL_SIGNING_SECRET", "REFUND_AGENT_AUDIT_KEY"} <= secrets
    assert set(config_map()) & secrets == set()
    example = set(one("Secret", "refund-agent-secrets")["stringData"])
    for workload, pod in pods():
        for container in pod["containers"]:
            assert container["envFrom"] == [{"configMapRef": {"name": "refund-agent-config"}}], workload
            env = container_env(container)
            for name in secrets & set(env):
                ref = env[name].get("valueFrom", {}).get("secretKeyRef")
                assert ref is not None and "value" not in env[name], f"{workload}: {name} is not from the Secret"
                assert ref["name"] == "refund-agent-secrets" and ref["key"] == name
                assert name in example or ref.get("optional") is True, f"{workload}: {name} missing from the example"
            for name, item in env.items():
                if "valueFrom" in item and "secretKeyRef" in item["valueFrom"]:
                    assert name in secrets, f"{workload}: {name} comes from the Secret but is no secret setting"
            # The secrets every process of a cluster must share (docs/operations/production.md).
            shared = {"REFUND_AGENT_API_TOKEN", "APPROVAL_SIGNING_SECRET", "REFUND_AGENT_AUDIT_KEY"} | CREDENTIAL_URLS
            assert shared <= set(env), workload


def test_the_config_map_and_the_secret_example_make_settings_every_process_accepts() -> None:
    values = {**config_map(), **one("Secret", "refund-agent-secrets")["stringData"]}
    settings = Settings(**{name.lower(): value for name, value in values.items()})
    assert settings.runtime.app_version != RuntimeSettings.model_fields["app_version"].default, (
        "pin REFUND_AGENT_APP_VERSION across releases (docs/operations/upgrades.md)"
    )
    assert not settings.payments.uses_sandbox and not settings.evidence.uses_sandbox


def test_commands_are_real_and_the_migration_job_runs_migrate() -> None:
    images = set()
    commands: dict[str, str] = {}
    for workload, pod in pods():
        (container,) = pod["containers"]
        assert container["command"][0] == "refund-agent", workload
        commands[workload] = parser().parse_args(container["command"][1:]).command
        images.add(container["image"])
    assert commands == {"refund-agent-migrate": "migrate", "refund-agent-api": "serve", "refund-agent-worker": "worker"}
    assert len(images) == 1, f"the Job migrates for the release the Deployments run: {images}"
    job = one("Job", "refund-agent-migrate")["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never" and job["backoffLimit"] >= 1


def test_grace_period_outlasts_the_drain_on_sigterm() -> None:
    shutdown = Settings(shutdown_timeout_seconds=config_map()["SHUTDOWN_TIMEOUT_SECONDS"]).runtime
    for name in ("refund-agent-api", "refund-agent-worker"):
        pod = one("Deployment", name)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        sleep = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
        http = HTTP_SHUTDOWN_TIMEOUT_SECONDS if container["command"][1] == "serve" else 0  # open requests first
        needed = sleep + http + shutdown.shutdown_timeout_seconds + TEARDOWN_ALLOWANCE_S
        assert pod["terminationGracePeriodSeconds"] >= needed, (name, needed)
    # The API keeps answering while the Service stops routing to it: SIGTERM comes after the preStop sleep.
    api = one("Deployment", "refund-agent-api")["spec"]["template"]["spec"]["containers"][0]
    assert api["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"


def test_rollouts_keep_every_replica_and_budgets_cover_the_pods() -> None:
    for name in ("refund-agent-api", "refund-agent-worker"):
        spec = one("Deployment", name)["spec"]
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        selector = spec["selector"]["matchLabels"]
        budgets = [
            doc
            for _, doc in documents()
            if doc["kind"] == "PodDisruptionBudget" and doc["spec"]["selector"]["matchLabels"] == selector
        ]
        assert len(budgets) == 1, name
        budget = budgets[0]["spec"]
        assert budget.get("minAvailable", 0) < spec["replicas"] or budget.get("maxUnavailable", 0) >= 1, name
    service = one("Service", "refund-agent")["spec"]
    api = one("Deployment", "refund-agent-api")["spec"]["template"]
    worker = one("Deployment", "refund-agent-worker")["spec"]["template"]
    assert service["selector"].items() <= api["metadata"]["labels"].items()
    assert not service["selector"].items() <= worker["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["ports"]} <= {p["name"] for p in api["spec"]["containers"][0]["ports"]}


def test_pods_run_as_the_image_user_on_a_read_only_root() -> None:
    image_uid = int(dict(instructions())["USER"].split(":")[0])
    data_dir = Path(config_map()["REFUND_AGENT_DATA_DIR"])
    for workload, pod in pods():
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == image_uid
        assert pod["automountServiceAccountToken"] is False
        (container,) = pod["containers"]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        mounts = {Path(m["mountPath"]) for m in container["volumeMounts"]}
        # The data directory is one the process makes inside a writable volume, so it owns it (mode 0700); the
        # volume's own root is not the data directory (the process could not close it to others).
        assert any(data_dir.parent == mount or mount in data_dir.parents for mount in mounts), workload
        assert data_dir not in mounts, workload
        assert Path("/tmp") in mounts, workload
        assert "memory" in container["resources"]["limits"], workload
