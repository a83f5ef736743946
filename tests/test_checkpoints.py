"""The checkpoints each path of a refund writes over its whole life are the ones the README lists: as many, and
the same steps in each of the refund's workflows, in order."""

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
_PATHS = ("paid at once", "refused", "approved", "rejected", "expired", "investigated, paid", "investigated, not yet")
_ROW = re.compile(rf"^\| ({'|'.join(_PATHS)}) \| (\d+) \| (.*) \|$", re.M)
#: One workflow in the last column: "`/settle`: DBOS.recv, ...", "`<key>` as approved".
_WORKFLOW = re.compile(r"^`(?P<workflow><key>|/\w+)`(?:: (?P<steps>.+)| as (?P<like>[a-z ]+))$")
_MOVING = ("ENQUEUED", "PENDING", "DELAYED")

StepsByWorkflow = dict[str, list[str]]


def readme_paths() -> dict[str, int]:
    return {path: int(count) for path, count, _ in _ROW.findall(README.read_text())}


def readme_steps() -> dict[str, StepsByWorkflow]:
    """The table's "steps, by workflow": path -> workflow (``<key>``, ``/settle``, ...) -> step names, in order.

    A row may start "as approved, with ..." (approved's workflows, those named after it replaced), and a workflow
    may read "`<key>` as approved" (that workflow's steps in the approved row)."""
    rows = {path: text for path, _, text in _ROW.findall(README.read_text())}
    read: dict[str, StepsByWorkflow] = {}

    def parse(path: str) -> StepsByWorkflow:
        if path not in read:
            text, steps = rows[path], {}
            inherits = re.match(r"^as (?P<like>[a-z ]+), with (?P<rest>.+)$", text)
            if inherits:
                steps, text = dict(parse(inherits["like"])), inherits["rest"]
            for part in text.split("; "):
                found = _WORKFLOW.match(part)
                assert found, f"README's checkpoint table: cannot read {part!r} in the {path!r} row"
                workflow = found["workflow"]
                steps[workflow] = parse(found["like"])[workflow] if found["like"] else found["steps"].split(", ")
            read[path] = steps
        return read[path]

    return {path: parse(path) for path in rows}


def checkpoints(client: DBOSClient, refund_id: str) -> tuple[int, StepsByWorkflow]:
    """Step outputs plus one status row per workflow, over every workflow of the refund, once all have ended;
    and each workflow's step names (``<key>`` for the deciding run, ``/settle`` for ``{refund_id}/settle``...)."""

    def settled() -> list[object] | None:
        found = client.list_workflows(workflow_ids=approvals.family(refund_id), load_input=False, load_output=False)
        return list(found) if found and all(wf.status not in _MOVING for wf in found) else None

    workflows = wait_for(settled, timeout=60, what=f"every workflow of {refund_id} to end")
    steps = {
        "<key>" if wf.workflow_id == refund_id else wf.workflow_id.removeprefix(refund_id): [  # type: ignore[attr-defined]
            step["function_name"]
            for step in client.list_workflow_steps(wf.workflow_id, load_output=False)  # type: ignore[attr-defined]
        ]
        for wf in workflows
    }
    return sum(len(names) for names in steps.values()) + len(workflows), steps


def test_the_readme_lists_every_path() -> None:
    assert sorted(readme_paths()) == sorted(_PATHS)


def test_the_readmes_counts_are_its_steps_plus_one_row_per_workflow() -> None:
    steps = readme_steps()
    counted = {
        path: sum(len(names) for names in by_workflow.values()) + len(by_workflow)
        for path, by_workflow in steps.items()
    }
    assert counted == readme_paths()


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_each_paths_checkpoints_are_the_readmes(env: Env) -> None:
    listed, listed_steps = readme_paths(), readme_steps()
    counted: dict[str, int] = {}
    steps: dict[str, StepsByWorkflow] = {}
    with running(env, approval_escalate_after_seconds=1.0, approval_timeout_seconds=2.5) as client:
        plain = "Please refund me"
        paths = {
            "paid at once": ("cp-paid-000001", "ord_1001", None, plain),
            "refused": ("cp-refused-0001", "ord_1004", None, plain),
            "approved": ("cp-approved-001", "ord_1002", "approve", plain),
            "rejected": ("cp-rejected-001", "ord_1003", "reject", plain),
            "expired": ("cp-expired-0001", "ord_1009", None, plain),
            # The carrier says returned to sender: the usual rules pay it. In transit: nothing yet, the ETA told.
            "investigated, paid": ("cp-lost-000001", "ord_1011", None, "My lamp never arrived."),
            "investigated, not yet": ("cp-transit-0001", "ord_1013", None, "My boots never arrived."),
        }
        for path, (key, order_id, decision, message) in paths.items():
            refund_id = submit(client, key, order_id, message)
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
    assert steps == listed_steps
