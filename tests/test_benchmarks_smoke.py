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


def test_parked_section_parks_recovers_and_approves_through_the_queue(tmp_path: Path) -> None:
    args = ["--sections", "parked", "--parked", "6", "--approvals", "3", "--polling-rounds", "0"]
    results, _ = _run_suite(tmp_path, args, timeout=280)
    runs = {run["load"]: run for run in results["parked"]["runs"]}
    assert set(runs) == {"refund_workflow (product)", "floor: wait only", "floor: 11 no-op steps, then wait"}, runs
    assert all("error" not in run for run in runs.values()), runs
    product = runs["refund_workflow (product)"]
    # Parked, recovered and waiting again, then the approved ones paid; new refunds were not held up.
    assert product["parked"] == 6 and product["kill_to_all_parked_s"] > 0
    assert (product["approved"], product["completed"]) == (3, 3)
    assert product["auto_refund_while_parked_s"] is not None
    assert product["auto_refund_after_restart_s"] is not None
    assert product["operations_before_wait"] == 12
    assert runs["floor: wait only"]["operations_before_wait"] == 1
    assert runs["floor: 11 no-op steps, then wait"]["operations_before_wait"] == 12
