"""write_report: Markdown tables + PNG plots; graceful on empty tables."""
from __future__ import annotations

from pathlib import Path

import pytest

from rudder.results.report import PLOTS, write_report
from rudder.results.store import ResultsStore
from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py

PNG = b"\x89PNG\r\n\x1a\n"


def collect(db: Path, root: Path) -> None:
    with ResultsStore(db) as st:
        st.ingest_runs([root])


def test_report_with_every_section(tmp_path):
    root = tmp_path / "runs"
    for m in (2, 4):
        for pol in ("none", "static", "agent"):
            write_synthetic_run(root, f"{pol}-{m}", machines=m, policy=pol, epochs=2, steps=10,
                                window=5, study="s")
    write_synthetic_run(root, "dead", policy="fixed", status="failed", reason="OOM killed",
                        epochs=2, epochs_done=1, steps=10)
    db = tmp_path / "r.duckdb"
    collect(db, root)
    path = write_report(db, tmp_path / "report")
    text = path.read_text()
    assert path.name == "report.md"
    for name in PLOTS:
        png = tmp_path / "report" / name
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000, name
        assert f"]({name})" in text
    for heading in ("## Epoch time", "## Remote rows fetched", "## Hit rate",
                    "### Pass@1", "### Staleness", "## Failed runs"):
        assert heading in text
    assert "| dataset | machines | policy |" in text
    assert "OOM killed" in text and "7 runs: 6 complete, 1 failed." in text
    assert "No agent runs" not in text


def test_report_without_agent_runs_says_so(tmp_path):
    root = tmp_path / "runs"
    write_synthetic_run(root, "none-2", policy="none", epochs=1, steps=5, study="s")
    write_synthetic_run(root, "static-2", policy="static", epochs=1, steps=5, study="s")
    write_synthetic_run(root, "agent-2", policy="agent", epochs=1, steps=5, study="other")
    write_synthetic_run(root, "dead", policy="fixed", status="failed", reason="OOM killed",
                        epochs=2, epochs_done=1, steps=5)
    db = tmp_path / "r.duckdb"
    collect(db, root)
    out = tmp_path / "report"
    out.mkdir()
    (out / "decisions.png").write_bytes(PNG)  # stale plot from an earlier report
    text = write_report(db, out, study="s").read_text()  # only study s: no agent, no failure
    assert "study `s`" in text and "2 runs: 2 complete." in text
    assert "OOM killed" not in text and "None: every collected run completed." in text
    assert "No agent runs: no decision records in the database." in text
    assert not (out / "decisions.png").exists()
    assert (out / "epoch_time.png").exists() and (out / "hit_rate.png").exists()


def test_report_on_an_empty_database(tmp_path):
    db = tmp_path / "r.duckdb"
    with ResultsStore(db):
        pass
    text = write_report(db, tmp_path / "report").read_text()
    assert "No runs collected" in text
    assert "No complete runs with epoch records." in text
    assert "No agent runs" in text
    assert not any((tmp_path / "report" / p).exists() for p in PLOTS)


def test_report_needs_a_database(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results database"):
        write_report(tmp_path / "missing.duckdb", tmp_path / "report")
