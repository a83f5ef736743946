"""The checkpoints each path of a refund writes over its whole life are the ones the README lists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dbos import DBOSClient

from agent import approvals
from agent.approval_workflows import decide_here
from agent.ops.processes import wait_for
from agent.status import parked
from tests.conftest import Env
from tests.identities import DANA
from tests.test_workflow import running, submit

README = Path(__file__).resolve().parents[1] / "README.md"
_ROW = re.compile(r"^\| (paid at once|refused|approved|rejected|expired) \| (\d+) \| (.*) \|$", re.M)
_MOVING = ("ENQUEUED", "PENDING", "DELAYED")


def readme_paths() -> dict[str, int]:
    return {path: int(count) for path, count, _ in _ROW.findall(README.read_text())}


def checkpoints(client: DBOSClient, refund_id: str) -> tuple[int, list[str]]:
    """Step outputs plus one status row per workflow, over every workflow of the refund, once all have ended."""

    def settled() -> list[object] | None:
        found = client.list_workflows(workflow_ids=approvals.family(refund_id), load_input=False, load_output=False)
        return list(found) if found and all(wf.status not in _MOVING for wf in found) else None

    workflows = wait_for(settled, timeout=60, what=f"every workflow of {refund_id} to end")
    names = [
        step["function_name"]
        for wf in workflows
        for step in client.list_workflow_steps(wf.workflow_id, load_output=False)  # type: ignore[attr-defined]
    ]
    return len(names) + len(workflows), names


def test_the_readme_lists_every_path() -> None:
    assert sorted(readme_paths()) == ["approved", "expired", "paid at once", "refused", "rejected"]


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_each_paths_checkpoints_are_the_readmes(env: Env) -> None:
    listed = readme_paths()
    counted: dict[str, int] = {}
    steps: dict[str, list[str]] = {}
    with running(env, approval_escalate_after_seconds=1.0, approval_timeout_seconds=2.5) as client:
        paths = {
            "paid at once": ("cp-paid-000001", "ord_1001", None),
            "refused": ("cp-refused-0001", "ord_1004", None),
            "approved": ("cp-approved-001", "ord_1002", "approve"),
            "rejected": ("cp-rejected-001", "ord_1003", "reject"),
            "expired": ("cp-expired-0001", "ord_1009", None),
        }
        for path, (key, order_id, decision) in paths.items():
            refund_id = submit(client, key, order_id)
            if order_id in ("ord_1002", "ord_1003", "ord_1009"):
                wait_for(lambda r=refund_id: parked(client, r), timeout=60, what="the refund to park")  # type: ignore[misc]
            if decision is not None:
                approvals.decide_pending(
                    decide_here,
                    refund_id=refund_id,
                    decision=decision,  # type: ignore[arg-type]
                    approver=DANA,
                    via="console",
                )
            counted[path], steps[path] = checkpoints(client, refund_id)
    assert counted == listed, steps
