"""write_report: the answer first (numbers checked against DuckDB and Belady on the traces),
PNG plots whose content is read back from the figure objects; graceful on empty tables."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rudder.records import update_run_json
from rudder.sim.oracle import belady
from rudder.results.report import (PLOTS, belady_rows_ratio, decisions_figure, hit_rate_figure,
                                   hit_rate_series, savings_figure, write_report)
from rudder.results.optimum import versus_belady
from rudder.results.queries import run_named
from rudder.results.store import ResultsStore
from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py
from rudder.sim.trace import Trace, TraceWriter

PNG = b"\x89PNG\r\n\x1a\n"
STEPS, EPOCHS = 10, 2


def collect(db: Path, root: Path) -> None:
    with ResultsStore(db) as st:
        st.ingest_runs([root])


def write_traces(run_dir: Path, ranks: int, seed: int) -> None:
    """A small real trace per rank (as training writes them), one minibatch per record."""
    rng = np.random.default_rng(seed)
    for rank in range(ranks):
        with TraceWriter(run_dir / f"trace-r{rank}.npz", halo=np.arange(400),
                         init=np.arange(60), capacity=100, part_id=rank,
                         num_parts=ranks) as w:
            for g in range(STEPS * EPOCHS):
                ids = np.unique(rng.integers(0, 500, 120))
                w.add(g // STEPS, ids)


@pytest.fixture(scope="module")
def study_db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    root = tmp / "runs"
    for m in (2, 4):
        for i, pol in enumerate(("none", "static", "lookahead", "agent")):
            d = write_synthetic_run(root, f"{pol}-{m}", machines=m, policy=pol, epochs=EPOCHS,
                                    steps=STEPS, window=5, study="s", simulated=False)
            write_traces(d, m, seed=10 * m + i)
            if pol == "agent":  # judged over 2 and 4 windows (as `rudder agent judge --horizon 4` leaves it)
                update_run_json(d, judge={"horizon": m, "judged": 1, "decisions": 1, "pass_at_1_cf": [1, 1], "s": 0.1})
    write_synthetic_run(root, "dead", policy="fixed", status="failed", reason="OOM killed",
                        epochs=2, epochs_done=1, steps=STEPS, study="s")
    db = tmp / "r.duckdb"
    collect(db, root)
    text = write_report(db, tmp / "report", study="s").read_text()
    return tmp, db, root, text


def answer(text: str) -> str:
    return text.split("## The answer", 1)[1].split("## Plots", 1)[0]


def policy_line(text: str, machines: int, policy: str) -> str:
    section = answer(text).split(f", {machines} machines (", 1)[1].split("###", 1)[0]
    return next(line for line in section.splitlines() if line.startswith(f"- **{policy}**"))


def test_answer_numbers_come_from_the_database(study_db):
    _, db, _, text = study_db
    with ResultsStore(db, read_only=True) as st:
        for m in (2, 4):
            per_epoch = st.query(f"""
                SELECT r.policy, avg(f) AS fetched, avg(t) AS epoch_s FROM (
                  SELECT run_id, epoch, sum(fetched_rows) AS f, max(t_epoch) AS t
                  FROM epochs GROUP BY ALL) e JOIN runs r USING (run_id)
                WHERE r.machines = {m} AND r.status = 'complete' GROUP BY r.policy""")
            v = per_epoch.set_index("policy")
            for pol in ("static", "lookahead", "agent"):
                line = policy_line(text, m, pol)
                rows = v.loc[pol, "fetched"] / v.loc["none", "fetched"]
                epoch = v.loc[pol, "epoch_s"] / v.loc["none", "epoch_s"]
                assert f"{rows:.2f}× the rows and {epoch:.2f}× the epoch time" in line, line
            # the bound: per minibatch max(sample, least compute over ranks), summed per rank,
            # slowest rank
            mbs = st.query(f"SELECT epoch, step, rank, t_sample, t_compute FROM minibatches "
                           f"WHERE run_id = 'none-{m}'")
            mbs["c"] = mbs.groupby(["epoch", "step"])["t_compute"].transform("min")
            mbs["b"] = mbs[["t_sample", "c"]].max(axis=1)
            bound = mbs.groupby(["epoch", "rank"])["b"].sum().groupby("epoch").max().mean()
            assert f"its features-free bound {bound:.2f} s" in answer(text)
    assert "**In short:**" in answer(text)


def test_answer_compares_each_run_with_both_beladys_on_its_trace(study_db):
    """The yardstick is Belady over all remote nodes (the traces hold ids 400-499 outside the
    halo 0-399, so it differs from the halo-only one, shown beside it)."""
    _, db, root, text = study_db
    with ResultsStore(db, read_only=True) as st:
        hits, fetched = st.query("SELECT sum(hits), sum(fetched_rows) FROM minibatches "
                                 "WHERE run_id = 'lookahead-4'").iloc[0]
    traces = [Trace.load(p) for p in (root / "lookahead-4").glob("trace-r*")]
    halo = [belady(t) for t in traces]
    full = [belady(t, universe="all") for t in traces]
    all_hits, halo_hits = sum(b.total_hits for b in full), sum(b.total_hits for b in halo)
    assert all_hits > halo_hits  # the two differ here, so the test tells them apart
    line = policy_line(text, 4, "lookahead")
    assert (f"{hits / all_hits:.2f} of the hits of Belady, all remote nodes and "
            f"{fetched / sum(b.misses for b in full):.2f}× its rows (Belady, halo only: "
            f"{hits / halo_hits:.2f} of its hits, {fetched / sum(b.misses for b in halo):.2f}× "
            "its rows)") in line, line
    assert "Belady's optimum (Belady, all remote nodes) would fetch" in answer(text)
    assert "(Belady, halo only: " in answer(text)


def test_versus_belady_has_both_universes_per_run(study_db):
    _, db, root, _ = study_db
    with ResultsStore(db, read_only=True) as st:
        bel, steps, missing = versus_belady(st, "s")
    assert not missing and len(bel) == 8
    for run in bel.itertuples():
        traces = [Trace.load(p) for p in (root / run.run_id).glob("trace-r*")]
        assert run.belady_all_hits == sum(belady(t, universe="all").total_hits for t in traces)
        assert run.belady_halo_hits == sum(belady(t).total_hits for t in traces)
        assert run.belady_all_fetched == sum(belady(t, universe="all").misses for t in traces)
        assert run.belady_halo_fetched == sum(belady(t).misses for t in traces)
        assert run.hits_of_belady_all == pytest.approx(run.hits / run.belady_all_hits)
        # a larger universe at the same memory: never more rows fetched
        assert run.belady_all_fetched <= run.belady_halo_fetched
    per_run = steps.groupby("run_id")[["belady_all_hits", "belady_halo_hits"]].sum()
    assert (per_run["belady_all_hits"] == bel.set_index("run_id")["belady_all_hits"]).all()


def test_answer_says_what_the_agent_decided_and_why(study_db):
    _, db, _, text = study_db
    with ResultsStore(db, read_only=True) as st:
        d = st.query("SELECT * FROM decisions JOIN runs USING (run_id) WHERE study = 's' "
                     "AND runs.policy = 'agent'")
    fb = d["fallback"].astype(bool)
    ans = d[~fb]
    a = answer(text)
    assert (f"was asked {len(d)} times over 2 run(s): {len(ans)} answers "
            f"({int(ans['replace'].astype(bool).sum())} replace") in a
    assert f"{int(fb.sum())} fallbacks" in a
    per_run = ans.groupby("run_id").size()
    assert f"Answers per run: {per_run.min()}{'–' + str(per_run.max()) if per_run.min() != per_run.max() else ' each'}." in a
    assert f"{len(ans)}× “synthetic”" in a  # the reasons, counted
    cf, ba = ans["correct_cf"].dropna(), ans["correct"].dropna()
    assert len(cf) and len(ba)
    assert (f"Judged against its counterfactual (the answer's action and its alternative replayed "
            f"from the same buffer state, over the next 2-4 windows): {int(cf.astype(bool).sum())} "
            f"of {len(cf)} answers were "
            f"right (pass@1). Before/after (the next window against the one it judged, which noise "
            f"moves): {int(ba.astype(bool).sum())} of {len(ba)}.") in a


def test_report_files_and_sections(study_db):
    tmp, _, _, text = study_db
    for name in PLOTS:
        png = tmp / "report" / name
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000, name
        assert f"]({name})" in text
    for heading in ("## The answer", "## Plots", "## Details", "#### Pass@1", "### Failed runs"):
        assert heading in text
    assert "OOM killed" in text and "9 runs: 8 complete, 1 failed." in text


def test_savings_figure_shows_ratios_per_policy_and_machines(study_db):
    _, db, _, _ = study_db
    with ResultsStore(db, read_only=True) as st:
        vs = run_named(st, "vs_none", "s")
        bel, _, _ = versus_belady(st, "s")
    fig = savings_figure(vs, bel)
    rows_ax, epoch_ax = fig.axes[:2]
    assert "remote rows fetched / none" in rows_ax.get_ylabel()
    assert "epoch time / none" in epoch_ax.get_ylabel()
    assert [t.get_text() for t in rows_ax.get_xticklabels()] == ["2 machines", "4 machines"]
    labels = rows_ax.get_legend_handles_labels()[1]
    assert [x for x in labels if x in ("static", "lookahead", "agent")] == \
        ["static", "lookahead", "agent"]
    assert "Belady, all remote nodes" in labels and "Belady, halo only" in labels
    assert "DistDGL (none) = 1" in labels
    # the yardstick's mark sits at its rows over none's, below (or at) the halo-only one's
    marks = {c.get_label(): c.get_segments() for c in rows_ax.collections if c.get_label()}
    y_all = marks["Belady, all remote nodes"][0][0][1]
    assert y_all == pytest.approx(belady_rows_ratio(bel, "synth-small", 2, "all"))
    assert y_all <= marks["Belady, halo only"][0][0][1]
    assert "features-free bound" in epoch_ax.get_legend_handles_labels()[1]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in rows_ax.containers}
    want = vs[vs["policy"] == "static"].sort_values("machines")["rows_ratio"].tolist()
    assert bars["static"] == pytest.approx(want)
    assert rows_ax.get_title() and epoch_ax.get_title()
    _legends_cover_no_data(fig)


def _legends_cover_no_data(fig) -> None:
    """Each panel's legend is drawn outside its axes (inside, it hid bar labels and curves)."""
    fig.canvas.draw()
    for ax in fig.axes:
        leg, box = ax.get_legend(), ax.get_window_extent()
        assert leg is not None
        assert leg.get_window_extent().y1 <= box.y0 + 1, ax.get_title()  # below, in pixels


def test_hit_rate_figure_has_belady_beside_each_policy(study_db):
    _, db, _, _ = study_db
    with ResultsStore(db, read_only=True) as st:
        hits = hit_rate_series(st, "s")
        bel, steps, _ = versus_belady(st, "s")
    fig = hit_rate_figure(hits, bel, steps)
    assert len(fig.axes) == 2
    for ax, m in zip(fig.axes, (2, 4)):
        assert f"{m} machines" in ax.get_title()
        assert ax.get_ylabel().startswith("%-hits") and "minibatch" in ax.get_xlabel()
        names = [ln.get_label() for ln in ax.get_lines()]
        assert names == ["static", "lookahead", "agent", "Belady, all remote nodes",
                         "Belady, halo only"]
        y_all, y_halo = (ln.get_ydata() for ln in ax.get_lines()[-2:])
        assert np.all((y_all >= 0) & (y_all <= 100))
        assert not np.allclose(y_all, y_halo)  # two curves, not one drawn twice
    _legends_cover_no_data(fig)


def test_hit_rate_figure_of_a_replay_without_a_machine_count(study_db):
    _, db, _, _ = study_db
    with ResultsStore(db, read_only=True) as st:
        hits = hit_rate_series(st, "s")
        bel, steps, _ = versus_belady(st, "s")
    hits["machines"] = hits["machines"].where(hits["machines"] != 4)  # 4 -> unknown (NA)
    fig = hit_rate_figure(hits, bel, steps)
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["synth-small, 2 machines",
                                                                  "synth-small, ? machines"]


def test_decisions_figure_marks_every_decision_with_its_reason(study_db):
    _, db, _, _ = study_db
    with ResultsStore(db, read_only=True) as st:
        dec = run_named(st, "agent_decisions", "s")
        hits = hit_rate_series(st, "s")
        bel, steps, _ = versus_belady(st, "s")
    fig, shown = decisions_figure(dec, hits, bel, steps)
    assert shown == 2
    for ax in fig.axes:
        run = re.search(r"agent run (\S+)", ax.get_title()).group(1)
        marks = sum(len(c.get_offsets()) for c in ax.collections)
        assert marks == int((dec["run_id"] == run).sum())
        assert any("synthetic" in t.get_text() for t in ax.texts)
        assert "%-hits" in ax.get_ylabel()
        # each answer's counterfactual verdict beside its reason (the synthetic runs have both)
        key = next(t.get_text() for t in ax.texts if t.get_text().startswith("Decisions and reasons"))
        h = run.rsplit("-", 1)[1]  # the fixture judged agent-<m> over m windows
        assert f"judged against its counterfactual, over the next {h} windows;\n no mark: " in key
        mine = dec[(dec["run_id"] == run) & dec["fallback"].isna()]
        for verdict, flag in (("[right]", True), ("[wrong]", False)):
            if (mine["correct_cf"] == flag).any():
                assert f"{verdict}: “synthetic”" in key, key


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
    assert "Belady's optimum is missing for 2 run(s)" in text  # no traces written
    assert not (out / "decisions.png").exists()
    assert (out / "savings.png").exists() and (out / "hit_rate.png").exists()


def test_report_on_an_empty_database(tmp_path):
    db = tmp_path / "r.duckdb"
    with ResultsStore(db):
        pass
    text = write_report(db, tmp_path / "report").read_text()
    assert "No runs collected" in text
    assert "No complete runs with epoch records" in text
    assert "No agent runs" in text
    assert not any((tmp_path / "report" / p).exists() for p in PLOTS)


def test_report_needs_a_database(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results database"):
        write_report(tmp_path / "missing.duckdb", tmp_path / "report")


def _point(policy, epoch_ratio, rows_ratio, runs=1):
    return {"dataset": "g", "machines": 2, "policy": policy, "simulated": False, "bandwidth": None,
            "runs": runs, "epoch_s": 10 * epoch_ratio, "epoch_ratio": epoch_ratio,
            "rows_ratio": rows_ratio, "speedup": 1 / epoch_ratio, "fetched_rows_per_epoch": 1000,
            "hit_pct": 50.0, "bound_s": None, "epoch_over_bound": None}


@pytest.mark.parametrize("second, tie", [(0.515, True), (0.53, False)])
def test_the_short_answer_calls_no_winner_within_the_noise(second, tie):
    """The fastest policy is named; one within TIE_MARGIN of its epoch is named beside it, with
    the runs each had, as no clear winner (the study's agent and lookahead, 0.49 vs 0.52)."""
    import pandas as pd

    from rudder.results.report import TIE_MARGIN, answer_lines

    vs = pd.DataFrame([_point("none", 1.0, 1.0), _point("agent", 0.493, 0.435),
                       _point("lookahead", second, 0.435, runs=3), _point("fixed", 0.71, 0.67)])
    (short,) = [ln for ln in answer_lines(vs, pd.DataFrame(), pd.DataFrame()) if "In short" in ln]
    assert "was **agent** at 2 machines on g: 0.43× the rows fetched and 0.49× the epoch" in short
    assert (second <= 0.493 * (1 + TIE_MARGIN)) == tie
    if tie:
        assert ("Within 5% of it there: **lookahead** (0.52× the epoch, 0.43× the rows); from 1 run "
                "each" in short and "no clear winner" in short), short
    else:
        assert "lookahead" not in short and "winner" not in short, short
    assert "fixed" not in short
