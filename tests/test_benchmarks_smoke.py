"""The benchmark harness runs end to end with tiny counts and writes well-formed results (no timings asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PG_SERVER

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("langgraph") is None or PG_SERVER.lower() in ("", "off"),
    reason="needs the bench extra (pip install -e '.[bench]') and the Postgres server",
)


def _run_suite(tmp_path: Path, args: list[str], timeout: float) -> tuple[dict[str, Any], str]:
    """``python -m benchmarks`` with these arguments, writing into ``tmp_path``: its results and its output."""
    root = Path(__file__).resolve().parents[1]
    args = [*args, "--no-readme", "--results-dir", str(tmp_path), "--postgres-url", PG_SERVER]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [result_file] = tmp_path.glob("suite-*.json")
    return json.loads(result_file.read_text()), done.stdout


def test_benchmark_suite_writes_results(tmp_path: Path) -> None:
    args = ["--sections", "cost", "--rounds", "1", "--refunds", "1", "--count-refunds", "0"]
    results, stdout = _run_suite(tmp_path, args, timeout=240)
    summary = results["cost"]["summary"]
    for backend in ("postgres", "sqlite"):
        rows = summary[backend]["rows"]
        assert set(rows) >= {"dbos", "plain", "floor", "langgraph", "langgraph_plain", "dbos_approval"}
        assert all(row["failed"] == 0 for row in rows.values()), rows
        assert all(row["wall_ms"] > 0 for row in rows.values())
        assert summary[backend]["checkpoints_per_refund"] > 0
    assert list(tmp_path.glob("suite-cost-*.png"))
    assert "Durability cost per refund" in stdout


def test_parked_sections_park_ask_restart_approve_and_expire(tmp_path: Path) -> None:
    args = ["--sections", "parked,customer_waits", "--parked", "0,6", "--parked-chunk", "3", "--restarts", "1"]
    args += ["--idle-seconds", "1", "--approvals", "2", "--wakes", "2"]
    args += ["--expiring", "4", "--expiry-timeout", "12", "--expiry-probes", "1", "--customer-waits", "3"]
    results, stdout = _run_suite(tmp_path, args, timeout=360)
    _customer_waits_are_rows(results["customer_waits"])
    assert "Waiting on customers beside approvers" in stdout
    parked = results["parked"]
    runs = {run["parked"]: run for run in parked["runs"]}
    assert set(runs) == {0, 6} and all("error" not in run for run in runs.values()), runs
    # Alternating chunks: auto-approved ones paid, the others parked (their deciding workflow ended,
    # the deadline waits as a DELAYED workflow), as the product's own status helper sees them too.
    throughput = runs[6]["throughput"]
    assert [c["kind"] for c in throughput["chunks"]] == ["auto", "park", "park", "auto"]
    for chunk in throughput["chunks"]:
        assert chunk["not_ended"] == 0
        if chunk["kind"] == "auto":
            assert chunk["rows"] == {"completed": 3}
        else:
            assert (chunk["rows"], chunk["deadlines"]) == ({"awaiting_approval": 3}, {"DELAYED": 3})
    assert throughput["status_parked_sample"] == [6, 6]
    # A restart finds nothing to recover, a new refund submitted then completes, the idle worker is read.
    for run in runs.values():
        assert run["restarts"]["pending_at_restart"] == 0
        assert all(s["new_refund_s"] is not None for s in run["restarts"]["samples"])
        assert all(s["worker_cpu_pct"] >= 0 and s["rss_mb"] > 0 for s in run["restarts"]["samples"])
    for path in ("api", "cli"):
        approved = runs[6]["approvals"][path]
        assert (approved["approved"], approved["completed"], approved["errors"]) == (2, 2, [])
    assert "approvals" not in runs[0]
    wake = parked["wake"]
    assert [wake[arm]["wake_to_start_ms"]["n"] for arm in wake["arms"]] == [2, 2]
    # Deadlines due at once: every refund expired and rejected, none paid or left unfinished; new refunds paid.
    expiry = parked["expiry"]
    assert (expiry["decisions"], expiry["refund_rows"]) == ({"expired": 4}, {"rejected": 4})
    assert (expiry["paid"], expiry["not_final"], expiry["continuations"]) == (0, 0, 0)
    assert expiry["deadline_workflows"] == {"SUCCESS": 4}
    assert expiry["probes_paid"] >= 1
    assert list(tmp_path.glob("suite-parked-*.png"))
    assert "Parked approvals" in stdout and "| target | measured |" in stdout


def _customer_waits_are_rows(section: dict[str, Any]) -> None:
    """3 refunds waiting on their customers beside 3 on approvers, against 3 on approvers and none."""
    assert "error" not in section, section
    arms = {arm["arm"]: arm for arm in section["arms"]}
    assert {name: (a["customers"], a["approvers"]) for name, a in arms.items()} == {
        "none": (0, 0),
        "approvers": (0, 3),
        "both": (3, 3),
    }
    # Each asking chunk waits on its customers: the refunds' rows, the questions open, reminder and deadline DELAYED.
    chunks = arms["both"]["throughput"]["chunks"]
    assert sorted(c["kind"] for c in chunks) == ["ask", "park"]
    for chunk in chunks:
        assert chunk["not_ended"] == 0
        if chunk["kind"] == "ask":
            assert chunk["rows"] == {"awaiting_customer": 3}
            assert (chunk["questions"], chunk["timers"]) == ({"delivery:open": 3}, {"DELAYED": 6})
        else:
            assert (chunk["rows"], chunk["deadlines"]) == ({"awaiting_approval": 3}, {"DELAYED": 3})
    # Still waiting after the restarts: two timers per wait, nothing PENDING; every restart's new refund paid.
    delayed = {"none": 0, "approvers": 6, "both": 12}
    for name, arm in arms.items():
        end = arm["waiting_at_end"]
        assert (end["delayed"], end["pending"]) == (delayed[name], 0)
        assert end["questions"] == ({"delivery:open": 3} if name == "both" else {})
        assert end["refund_rows"].get("awaiting_customer", 0) == arm["customers"]
        assert end["refund_rows"].get("awaiting_approval", 0) == arm["approvers"]
        [sample] = arm["restarts"]["samples"]
        assert (sample["pending_at_restart"], sample["delayed_at_restart"]) == (0, delayed[name])
        assert sample["open_questions_at_restart"] == arm["customers"]
        assert sample["new_refund_s"] is not None and sample["rss_mb"] > 0 and sample["worker_cpu_pct"] >= 0
    assert set(section["ratios"]) == {"approvers_vs_none", "both_vs_none", "both_vs_approvers"}
    assert all(r["new_refund_s"] is not None for r in section["ratios"].values())
