"""`edgespec bench --cold` (edgespec.bench.cold): every mode runs in its own process on the tiny
pair and reports the answer's stats; the summary sets the modes side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.bench.cold import MODES, ColdJob, check_cold_methods, plan_jobs, run_cold
from edgespec.errors import ConfigError


def test_each_mode_answers_in_a_fresh_process(
    tiny_self_pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))  # the app's calibration
    model = {"target": str(tiny_self_pair[0]), "draft": str(tiny_self_pair[1])}
    prompt = type("P", (), {"id": "p1", "text": "hello there"})
    # K fixed: under adaptive K a calibrated run may rightly start this self-draft off (a draft
    # step costs a target step: it never pays), and its acceptance would then not be read
    jobs = plan_jobs(model, [prompt], ["spec"], max_tokens=12)
    assert [j.mode for j in jobs] == list(MODES)
    (row,) = run_cold(jobs, tmp_path, quiet=True)
    records = json.loads((tmp_path / "cold.json").read_text())["records"]
    assert [r.get("error") for r in records] == [None] * 3
    # A self-draft: every draft accepted, whichever way the answer was asked for.
    assert all(r["tokens"] == 12 and r["acceptance"] == 1.0 for r in records)
    assert set(row["tokens_per_s"]) == set(MODES) and row["app/warm"] > 0
    (app,) = [r for r in records if r["mode"] == "app"]  # the UI thread's own time was measured
    assert 0 < app["ui_cpu_s"] and row["ui/engine"] == round(
        app["ui_cpu_s"] / app["decode_time"], 4
    )


def test_a_failed_run_is_a_record_and_unknown_methods_are_refused(tmp_path: Path) -> None:
    job = ColdJob({"target": str(tmp_path / "nothing")}, "plain", "cold", "p", "hi", 4)
    assert run_cold([job], tmp_path, quiet=True) == []  # nothing measured
    (record,) = json.loads((tmp_path / "cold.json").read_text())["records"]
    assert "nothing" in record["error"] and record["mode"] == "cold"
    with pytest.raises(ConfigError, match="mlx-lm"):
        check_cold_methods(["plain", "mlx-lm"])
