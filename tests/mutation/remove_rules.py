# ruff: noqa: E501  (one removal per line)
"""Remove each evidence rule in turn and check that tests/test_evidence_policy.py fails without it.

    python tests/mutation/remove_rules.py        # prints one line per rule; exit 1 if a removal goes unnoticed

Each removal is one edit to agent/evidence_policy.py or agent/policy.py, made on a scratch copy of the tree
(the files in place are never touched). A rule whose removal leaves the table passing is a rule no test holds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST = "tests/test_evidence_policy.py"

#: (rule, file, text, replacement)
REMOVALS: list[tuple[str, str, str, str]] = [
    ("an open dispute refuses", "agent/evidence_policy.py", "for dispute in evidence.risk.open_disputes:", "for dispute in []:"),
    ("an early fraud warning is flagged", "agent/evidence_policy.py", 'flags=("early_fraud_warning",)))', "))"),
    ("an early fraud warning goes to a person", "agent/evidence_policy.py", 'Finding("person", (f"{fact}; a person decides",)', 'Finding("none", (f"{fact}; a person decides",)'),
    ("a dispute refuses whatever the category", "agent/evidence_policy.py", "if evidence.risk is not None and evidence.risk.open_disputes:", "if False:"),
    ("a refund paid at once needs its charge's risk read", "agent/policy.py", 'if verdict.kind == "auto_approve" and check_risk and', 'if verdict.kind == "auto_approve" and False and'),
    ("policy asks for the risk of a refund paid at once", "agent/policy.py", 'return ("risk",) if verdict.kind == "auto_approve" else ()', "return ()"),
    ("a model category the words do not name goes to a person", "agent/policy.py", 'if (disagreement := claim.disagreement) and found.kind in ("none", "person"):', "if (disagreement := claim.disagreement) and False:"),
    ("a claim about the goods needs the parcel delivered", "agent/evidence_policy.py", '            found.append(Finding("person", (reason,), (f"the carrier shows {where} {said}",)))', '            found.append(Finding("none", (reason,), (f"the carrier shows {where} {said}",)))'),
    ("a claim about the goods needs the tracking", "agent/evidence_policy.py", 'categories & {"not_received", *ABOUT_THE_GOODS}:', 'categories & {"not_received"}:'),
    ("a return or a change of mind needs the return", "agent/evidence_policy.py", '    if categories & _RETURNS_CLAIMS:\n        wanted.append("returns")', '    if False:\n        wanted.append("returns")'),
    ("the strictest finding wins", "agent/evidence_policy.py", "kind = max((f.kind for f in found), key=_RANK.__getitem__)", "kind = found[-1].kind"),
    ("the grace is added to the expected date", "agent/evidence_policy.py", "tracking.est_delivery + ETA_GRACE:", "tracking.est_delivery - ETA_GRACE:"),
    ("a claim that needs evidence goes unchecked to a person", "agent/evidence_policy.py", 'found.append(Finding("person", (f"the claim needs the {_NAMES[need]}', 'found.append(Finding("none", (f"the claim needs the {_NAMES[need]}'),
    ("a claim about the charge needs its risk looked up", "agent/evidence_policy.py", 'if order.charge_id and "duplicate_charge" in categories:', "if False:"),
    ("a proposal above the request stays with a person when a return lowers it", "agent/policy.py", "if over and kind == \"auto_approve\":", "if False:"),
    ("a failed look-up goes to a person", "agent/evidence_policy.py", "            found.append(Finding(\"person\", (reason,)))\n        elif", "            found.append(Finding(\"none\", (reason,)))\n        elif"),
    ("an order without tracking goes to a person", "agent/evidence_policy.py", 'if "not_received" in categories and not order.tracking_code:', "if False:"),
    ("an unknown parcel goes to a person", "agent/evidence_policy.py", 'if not tracking.found or tracking.status == "unknown":', "if False:"),
    ("delivered goes to a person", "agent/evidence_policy.py", '        return Finding("person", (fact,), (fact,))\n    if tracking.status in', '        return Finding("none", (fact,), (fact,))\n    if tracking.status in'),
    ("no expected date goes to a person", "agent/evidence_policy.py", "if tracking.est_delivery is None:", "if False:"),
    ("past its expected date goes to a person", "agent/evidence_policy.py", "if as_of > tracking.est_delivery + ETA_GRACE:", "if False:"),
    ("in transit waits", "agent/evidence_policy.py", '    return Finding("wait", (fact,), (fact,), customer_note=note)\n\n\ndef _returns', '    return Finding("none", (fact,), (fact,), customer_note=note)\n\n\ndef _returns'),
    ("no return opened waits", "agent/evidence_policy.py", 'if receipt.status == "none":', "if False:"),
    ("a never-scanned label waits", "agent/evidence_policy.py", 'if receipt.status == "label_created":', "if False:"),
    ("a return on its way waits", "agent/evidence_policy.py", 'if receipt.status == "in_transit":', "if False:"),
    ("nothing received waits", "agent/evidence_policy.py", "    if not received:\n", "    if False:\n"),
    ("a worn line goes to a person", "agent/evidence_policy.py", "    if worn:\n", "    if False:\n"),
    ("only received lines are refunded", "agent/policy.py", "if found.bound is not None and verdict.amount > found.bound:", "if False:"),
    ("wait refuses for now", "agent/policy.py", 'if found.kind in ("refuse", "wait"):', 'if found.kind in ("refuse",):'),
    ("evidence never lifts a refusal", "agent/policy.py", '    if verdict.kind == "refuse":\n        return verdict\n    if found.kind', '    if False:\n        return verdict\n    if found.kind'),
    ("too many refunds in the window go to a person", "agent/policy.py", "if len(recent) + 1 > limits.customer_max_refunds:", "if False:"),
    ("too much money in the window goes to a person", "agent/policy.py", "if spent + verdict.amount > cap:", "if False:"),
    ("older refunds fall out of the window", "agent/policy.py", "and h.created_at >= since and", "and"),
    ("refused refunds are not counted", "agent/policy.py", "and h.status not in _ENDED_UNPAID", ""),
    ("this refund is not counted twice", "agent/policy.py", "if h.refund_id != claim.refund_id and", "if"),
]  # fmt: skip


def main() -> int:
    unnoticed = 0
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", "test-artifacts", "__pycache__"))
        for rule, name, text, replacement in REMOVALS:
            path = tree / name
            original = path.read_text()
            if original.count(text) != 1:
                print(f"STALE   {rule}: the text to remove is not in {name} exactly once")
                unnoticed += 1
                continue
            path.write_text(original.replace(text, replacement))
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", "--noconftest", TEST],
                cwd=tree,
                capture_output=True,
                text=True,
            )
            path.write_text(original)
            caught = done.returncode != 0
            unnoticed += not caught
            print(f"{'caught ' if caught else 'MISSED '} {rule}")
    return 1 if unnoticed else 0


if __name__ == "__main__":
    sys.exit(main())
