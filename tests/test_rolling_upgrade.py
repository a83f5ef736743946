"""A rolling upgrade under load at small size: no refund lost, paid twice or stuck, every old process drained.

The drill (proving/rolling_upgrade.py, full size from its command line) runs real processes on one Postgres: an
API and two workers, replaced one by one by a new release as a Deployment with ``maxUnavailable: 0`` would, while
refunds are submitted, parked and approved over HTTP. The counts come from the API and the payment provider's ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proving.rolling_upgrade import DrillConfig, run_drill
from tests.conftest import BACKENDS, PG_SERVER


@pytest.mark.skipif("postgres" not in BACKENDS, reason="REFUND_AGENT_TEST_POSTGRES_URL=off")
def test_rolling_upgrade_loses_duplicates_and_strands_nothing(tmp_path: Path) -> None:
    config = DrillConfig(
        postgres_url=PG_SERVER,
        workers=2,
        apis=1,
        refunds=15,
        large_every=3,
        submit_interval_s=0.3,
        clients=2,
        roll_after=3,
        pre_stop_s=0.5,
        drain_s=90.0,
        work_dir=tmp_path / "drill",
        out=tmp_path / "report.json",
    )
    lines: list[str] = []
    report = run_drill(config, say=lines.append)
    summary = "\n".join(lines)

    assert (report["lost"], report["duplicated"], report["stuck"]) == (0, 0, 0), summary
    assert report["outcomes"] == {"completed": 15}, summary
    assert report["provider_refunds"] == 15 and report["parked_and_approved"] == 5, summary
    # Every old process stopped on SIGTERM, by itself (exit 0), inside the grace period.
    assert report["retired_exit_codes"] == {"0": 3} and report["retired_killed_after_grace"] == 0, summary
    assert report["violations"] == [], summary
    assert report["ok"] is True
    assert report["submitted_during_rollout"] > 0, summary  # the load overlapped the rollout
    assert report["longest_client_pause_s"] is not None
    assert (tmp_path / "report.json").exists()
