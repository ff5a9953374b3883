"""A Markdown report of a results database: the answer first, in words and numbers taken from
the data, then plots, then the detailed tables.

    report.md      the answer (per machine count: what each policy saved in rows fetched and
                   epoch time against DistDGL = policy `none`, how close it came to Belady's
                   optimum and to the features-free pipeline bound; what the agent decided and
                   why), then the plots and the named queries as tables
    savings.png    rows fetched and epoch time as a share of `none`, per policy and machine
                   count, with both Belady's rows and the features-free bound marked
    hit_rate.png   %-hits over training per policy against both Belady's, one panel per
                   (dataset, machines)
    decisions.png  each agent run's hit rate over training with its decisions on that timeline
                   (replace / keep / fallback) and their reasons

Belady's optimum is replayed from the runs' traces (rudder.results.optimum), so it needs the run
directories; without them the report says so and leaves it out. The yardstick is "Belady, all
remote nodes" (any remote node the trainer pulled may be kept, at the run's buffer memory);
"Belady, halo only" (the 1-hop halo, what today's buffer can hold) is shown beside it. The figures are built by
functions that return matplotlib Figures (tests read their series and labels), drawn with the
Agg canvas directly (no pyplot), so importing this module changes no global backend.
"""
from __future__ import annotations

import math
import re
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from rudder.results.queries import NAMED, run_named, runs_relation
from rudder.results.store import ResultsStore
from rudder.sim.oracle import NAMES as BELADY  # all: the yardstick; halo: beside it

PLOTS = ("savings.png", "hit_rate.png", "decisions.png")
OLD_PLOTS = ("epoch_time.png", "remote_rows.png")  # earlier reports' plots: removed
HIT_RATE_POINTS = 60  # at most this many points per hit-rate curve (global steps binned)
POLICY_ORDER = ("none", "static", "fixed", "lookahead", "agent")
COLORS = {"none": "0.45", "static": "tab:blue", "fixed": "tab:orange", "lookahead": "tab:green",
          "agent": "tab:purple"}
MAX_DECISION_PANELS = 6


def write_report(db_path: str | Path = "results.duckdb", out_dir: str | Path = "report",
                 study: str | None = None) -> Path:
    """Writes `out_dir/report.md` and its PNG plots; returns the report's path."""
    from rudder.results.optimum import versus_belady

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in PLOTS + OLD_PLOTS:  # a plot not drawn this time must not linger
        (out / name).unlink(missing_ok=True)
    with ResultsStore(db_path, read_only=True) as store:
        tables = {name: run_named(store, name, study) for name in NAMED}
        status = store.query(
            f"SELECT status, count(*) AS runs FROM {runs_relation(study)} GROUP BY status "
            "ORDER BY status")
        hits = hit_rate_series(store, study)
        bel_runs, bel_steps, no_trace = versus_belady(store, study)

    vs = tables["vs_none"]
    decisions = tables["agent_decisions"]
    md: list[str] = ["# Rudder results", ""]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    scope = f"study `{study}`" if study else "all studies"
    md += [f"Database `{db_path}`, {scope}, generated {now}.", ""]
    runs = tables["runs"]
    if runs.empty:
        md += ["No runs collected (run `rudder collect RUNS_DIR` first).", ""]
    else:
        by_status = ", ".join(f"{r.runs} {r.status}" for r in status.itertuples())
        md += [f"{len(runs)} runs: {by_status}.", ""]

    md += ["## The answer", ""]
    steps = ({r: int(g["step"].max()) + 1 for r, g in hits.groupby("run_id")}
             if not hits.empty else {})
    md += answer_lines(vs, bel_runs, decisions, no_trace, steps)

    md += ["## Plots", ""]
    if not vs.empty and (vs["policy"] != "none").any() and vs["rows_ratio"].notna().any():
        save(savings_figure(vs, bel_runs), out / "savings.png")
        md += ["![rows and epoch time vs none](savings.png)", ""]
    else:
        md += ["No policy ran beside `none` at the same dataset and machine count: nothing to "
               "compare.", ""]
    if not hits.empty:
        save(hit_rate_figure(hits, bel_runs, bel_steps), out / "hit_rate.png")
        md += ["![hit rate over training vs Belady](hit_rate.png)", ""]
    if not decisions.empty:
        fig, shown = decisions_figure(decisions, hits, bel_runs, bel_steps)
        save(fig, out / "decisions.png")
        md += ["![the agent's decisions on the hit-rate timeline](decisions.png)", ""]
        agent_runs = decisions["run_id"].nunique()
        if shown < agent_runs:
            md += [f"The decision plot shows {shown} of {agent_runs} agent runs.", ""]

    md += ["## Details", "", "### Against `none`, Belady and the bound", "",
           NAMED["vs_none"].description + ".", ""]
    md += [_md_table(vs) if not vs.empty else "No complete runs with epoch records.", ""]
    if not bel_runs.empty:
        cols = ["run_id", "machines", "policy", "hits", "belady_all_hits", "hits_of_belady_all",
                "belady_halo_hits", "hits_of_belady_halo", "fetched_rows", "belady_all_fetched",
                "fetched_over_belady_all", "belady_halo_fetched", "fetched_over_belady_halo"]
        md += ["Per run against Belady's optimum (demand fetch, the run's capacity in rows and "
               "initial fill, replayed on its own trace; `rudder oracle RUN_DIR` gives the same "
               f"per rank): `belady_all_*` = {BELADY['all']} (the yardstick: any remote node "
               f"the trainer pulled may be kept), `belady_halo_*` = {BELADY['halo']} (1-hop "
               "halo nodes only, what the buffer holds today):", "",
               _md_table(bel_runs[cols]), ""]
    for name, title in (("speedup", "Epoch time"), ("remote_rows", "Remote rows fetched"),
                        ("hit_rate", "Hit rate")):
        df = tables[name]
        md += [f"### {title}", "", NAMED[name].description + ".", "",
               _md_table(df) if not df.empty else "No complete runs with epoch records.", ""]
    md += ["### Agent decisions", ""]
    if decisions.empty:
        md += ["No agent runs: no decision records in the database.", ""]
    else:
        md += ["#### Pass@1", "", NAMED["pass_at_1"].description + ".", "",
               _md_table(tables["pass_at_1"]), "",
               _pass_line(tables["pass_at_1"]), "",
               "#### Staleness", "", NAMED["staleness"].description + ".", "",
               _md_table(tables["staleness"]), ""]

    md += ["### Failed runs", ""]
    fr = tables["failed_runs"]
    md += [_md_table(fr) if not fr.empty else "None: every collected run completed.", ""]

    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


# --- the answer ---------------------------------------------------------------------------------
def _x(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{float(v):.2f}×"


def _r(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{float(v):.2f}"


def _policies(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["policy"]))
    return [p for p in POLICY_ORDER if p in present] + \
        sorted(p for p in present if p not in POLICY_ORDER)


_BELADY_SUMS = ["belady_all_hits", "belady_all_fetched", "belady_halo_hits",
                "belady_halo_fetched"]


def _belady_by_point(bel_runs: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, machines, policy), pooled: hits_of_belady_<u> and fetched_over_belady_<u>
    for u = all (the yardstick) and halo."""
    from rudder.results.optimum import add_ratios

    if bel_runs.empty:
        return pd.DataFrame(columns=["dataset", "machines", "policy", *_BELADY_SUMS,
                                     *(f"{r}_{u}" for u in ("all", "halo")
                                       for r in ("hits_of_belady", "fetched_over_belady"))])
    g = bel_runs.groupby(["dataset", "machines", "policy"], as_index=False)[
        ["hits", "fetched_rows", *_BELADY_SUMS]].sum()
    return add_ratios(g)


def belady_rows_ratio(bel_runs: pd.DataFrame, dataset, machines,
                      universe: str = "all") -> float | None:
    """Rows Belady (`all`: all remote nodes, the yardstick; `halo`: halo only) fetches as a
    share of what `none` fetched, at one grid point (runs that did not fetch as `none` did are
    compared on their own trace: the same minibatches)."""
    part = bel_runs[(bel_runs["dataset"] == dataset) & (bel_runs["machines"] == machines)]
    none = part[part["policy"] == "none"]
    if none.empty or not none["fetched_rows"].sum():
        return None
    buffered = part[part["policy"] != "none"]
    src = buffered if not buffered.empty else none
    # Belady at the buffer's capacity and fill, on the same minibatches none fetched
    return float(src[f"belady_{universe}_fetched"].sum() / len(src)
                 / (none["fetched_rows"].sum() / len(none)))


def answer_lines(vs: pd.DataFrame, bel_runs: pd.DataFrame, decisions: pd.DataFrame,
                 no_trace: list[str] | None = None, steps: dict | None = None) -> list[str]:
    """The report's opening: per (dataset, machines) what each policy saved against `none`,
    its distance to Belady and the bound; then what the agent decided and why."""
    if vs.empty:
        return ["No complete runs with epoch records: nothing to answer yet.", ""]
    md: list[str] = []
    bel = _belady_by_point(bel_runs)
    real = vs[~vs["simulated"].fillna(False).astype(bool)] if "simulated" in vs else vs
    real = real if not real.empty else vs
    best = real[(real["policy"] != "none") & real["epoch_ratio"].notna()]
    if not best.empty:
        top = best.loc[best["epoch_ratio"].idxmin()]
        md += [f"**In short:** the fastest policy against DistDGL (`none`) was **{top.policy}** "
               f"at {int(top.machines)} machines on {top.dataset}: {_x(top.rows_ratio)} the rows "
               f"fetched and {_x(top.epoch_ratio)} the epoch time ({_x(top.speedup)} as fast)."
               + _close_behind(best, top), ""]
    for (ds, m, sim), part in real.groupby(["dataset", "machines", "simulated"], sort=True):
        link = part["bandwidth"].dropna()
        link = f"links capped at {link.iloc[0]}" if len(link) else "unshaped links"
        none = part[part["policy"] == "none"]
        head = f"### {ds}, {int(m)} machines ({link}{', simulated' if sim else ''})"
        md += [head, ""]
        if none.empty:
            md += ["No `none` run here: nothing to compare against.", ""]
            continue
        n = none.iloc[0]
        md += [f"DistDGL (`none`): {n.epoch_s:.2f} s per epoch, {n.fetched_rows_per_epoch:,.0f} "
               f"remote rows fetched per epoch (all trainers); its features-free bound "
               f"{n.bound_s:.2f} s, so fetching features costs it "
               f"{100 * (1 - n.bound_s / n.epoch_s):.0f}% of the epoch." if n.bound_s and
               n.epoch_s else f"DistDGL (`none`): {n.epoch_s:.2f} s per epoch.", ""]
        for pol in _policies(part):
            if pol == "none":
                continue
            row = part[part["policy"] == pol].iloc[0]
            b = bel[(bel["dataset"] == ds) & (bel["machines"] == m) & (bel["policy"] == pol)]
            vs_bel = ""
            if not b.empty and pd.notna(b.iloc[0].hits_of_belady_all):
                o = b.iloc[0]
                vs_bel = (f"; {o.hits_of_belady_all:.2f} of the hits of {BELADY['all']} and "
                          f"{_x(o.fetched_over_belady_all)} its rows ({BELADY['halo']}: "
                          f"{_r(o.hits_of_belady_halo)} of its hits, "
                          f"{_x(o.fetched_over_belady_halo)} its rows)")
            bound = (f"; epoch {_x(row.epoch_over_bound)} the features-free bound"
                     if pd.notna(row.epoch_over_bound) else "")
            verdict = ("faster" if row.epoch_ratio < 0.97 else
                       "slower" if row.epoch_ratio > 1.03 else "as fast")
            md.append(f"- **{pol}**: {_x(row.rows_ratio)} the rows and {_x(row.epoch_ratio)} the "
                      f"epoch time of `none` ({verdict}: {_x(row.speedup)} its speed), "
                      f"{row.hit_pct:.0f}% hits{vs_bel}{bound}.")
        ratio = belady_rows_ratio(bel_runs, ds, m) if not bel_runs.empty else None
        opt = []
        if ratio is not None:
            halo = belady_rows_ratio(bel_runs, ds, m, "halo")
            opt.append(f"Belady's optimum ({BELADY['all']}) would fetch {_x(ratio)} the rows "
                       f"of `none` ({BELADY['halo']}: {_x(halo)})")
        if n.bound_s and n.epoch_s:
            opt.append(f"the features-free bound is {_x(n.bound_s / n.epoch_s)} its epoch time")
        if opt:
            md += ["- " + "; ".join(opt) + " (no policy can do better than either)."]
        md.append("")
    if no_trace:
        md += [f"Belady's optimum is missing for {len(no_trace)} run(s) whose traces were not "
               f"readable here (e.g. {no_trace[0]}).", ""]
    md += agent_lines(decisions, steps)
    return md


# Repeated runs of one setting on a shared host differ by a few percent in epoch time
# (BENCHMARKS.md: up to ~4%), so a lead smaller than this is not called a win.
TIE_MARGIN = 0.05


def _close_behind(best: pd.DataFrame, top) -> str:
    """The other policies at the fastest one's point whose epoch is within TIE_MARGIN of it."""
    here = best[(best["dataset"] == top.dataset) & (best["machines"] == top.machines)
                & (best["policy"] != top.policy)]
    near = here[here["epoch_ratio"] <= top.epoch_ratio * (1 + TIE_MARGIN)]
    if near.empty:
        return ""
    runs = int(min(near["runs"].min(), top.runs)) if "runs" in best else None
    names = ", ".join(f"**{r.policy}** ({_x(r.epoch_ratio)} the epoch, {_x(r.rows_ratio)} the rows)"
                      for r in near.sort_values("epoch_ratio").itertuples())
    each = f"from {runs} run{'s' if runs != 1 else ''} each, " if runs else ""
    return (f" Within {TIE_MARGIN:.0%} of it there: {names}; {each}a lead that small is within "
            "run-to-run noise: no clear winner.")


def _over_windows(judged: pd.DataFrame) -> str:
    """', over the next N windows' for the judged decisions' horizon (N-M where runs were
    judged over different ones); '' where no run recorded it."""
    if "cf_horizon" not in judged:
        return ""
    h = sorted(int(x) for x in judged["cf_horizon"].dropna().unique())
    if not h:
        return ""
    n = str(h[0]) if len(h) == 1 else f"{h[0]}-{h[-1]}"
    return f", over the next {n} window{'' if n == '1' else 's'}"


def _span(counts: pd.Series) -> str:
    """'6 each' or '4–6'."""
    lo, hi = int(counts.min()), int(counts.max())
    return f"{lo} each" if lo == hi else f"{lo}–{hi}"


def first_applied(d: pd.DataFrame) -> float | None:
    """The first minibatch at which a model answer (not a fallback) was applied."""
    fb = d["fallback"].astype("boolean").fillna(False).to_numpy(bool)
    steps = d.loc[~fb, "applied_step"].dropna()
    return float(steps.min()) if len(steps) else None


def agent_lines(decisions: pd.DataFrame, steps: dict | None = None) -> list[str]:
    """What the agent decided and why, from its decision records. steps: run id ->
    minibatches per trainer (to say how long the fallback steered)."""
    if decisions.empty:
        return ["No agent runs: no decision records in the database.", ""]
    d = decisions
    fb = d["fallback"].astype("boolean").fillna(False).to_numpy(bool)
    ans = d[~fb]
    rep = ans["replace"].astype("boolean")
    applied = ans["applied_step"].notna()
    model = ", ".join(str(x) for x in d["model"].dropna().unique()) or "?"
    per_run = ans.groupby("run_id").size().reindex(d["run_id"].unique(), fill_value=0)
    md = ["### The agent", "",
          f"The agent ({model}) was asked {len(d)} times over {d['run_id'].nunique()} run(s): "
          f"{len(ans)} answers ({int(rep.fillna(False).sum())} replace, "
          f"{int((~rep).fillna(False).sum())} keep; {int(applied.sum())} applied before the run "
          f"ended), {int(fb.sum())} fallbacks (no usable answer in time: the fallback policy "
          f"steered). Answers per run: {_span(per_run)}.", ""]
    if len(ans):
        budgets = ans[rep.fillna(False).to_numpy(bool)]["budget"].dropna().value_counts()
        if len(budgets):
            md += ["Budgets of its replace answers: " + ", ".join(
                f"{k} {v}×" for k, v in budgets.items()) + ".", ""]
        md += ["Why, in its own words (most frequent first):", ""]
        plain = ans["reason"].fillna("(no reason)").map(_plain_reason)
        for reason, count in plain.value_counts().head(6).items():
            md.append(f"- {count}× “{reason}”")
        md.append("")
        cf = ans["correct_cf"].dropna()
        judged = ans["correct"].dropna()
        if len(cf):
            md += [f"Judged against its counterfactual (the answer's action and its alternative "
                   f"replayed from the same buffer state{_over_windows(ans.loc[cf.index])}): "
                   f"{int(cf.astype(bool).sum())} of "
                   f"{len(cf)} answers were right (pass@1)."
                   + (f" Before/after (the next window against the one it judged, which noise "
                      f"moves): {int(judged.astype(bool).sum())} of {len(judged)}." if len(judged) else ""),
                   ""]
        elif len(judged):
            md += [f"{int(judged.astype(bool).sum())} of {len(judged)} judged answers predicted "
                   "the measured effect on hit rate and rows (pass@1, before/after; "
                   "`rudder agent judge RUN_DIR` judges them against their counterfactual).", ""]
        lat = ans["latency_s"].dropna()
        if len(lat):
            md += [f"Answer latency: median {lat.median():.1f} s, max {lat.max():.1f} s.", ""]
    runs = []
    for run_id, g in d.groupby("run_id", sort=False):
        first, n = first_applied(g), (steps or {}).get(run_id)
        total = f" of {n}" if n else ""
        runs.append(f"{run_id}: first answer applied at minibatch {int(first)}{total}"
                    if first is not None else f"{run_id}: no answer applied"
                    + (f" in {n} minibatches" if n else ""))
    if runs:
        md += ["Until an answer is applied the fallback policy steers (`agent.fallback`; `auto` = "
               "lookahead when the run samples ahead), so the agent's rows and hits are mostly "
               "the fallback's where answers come late: " + "; ".join(runs) + ".", ""]
    return md


def _pass_line(p) -> str:
    """All decisions: Pass@1 before/after beside the counterfactual's (correct_cf)."""
    def share(ok: str, n: str) -> str:
        total = int(p[n].sum())
        return f"{int(p[ok].sum()) / total:.2f} ({total} judged)" if total else "not judged"
    hint = "" if int(p["evaluated_cf"].sum()) else " (`rudder agent judge RUN_DIR` judges them)"
    return (f"Pass@1 of all decisions: before/after {share('correct', 'evaluated')}, "
            f"counterfactual {share('correct_cf', 'evaluated_cf')}{hint}.")


# --- data ---------------------------------------------------------------------------------------
def hit_rate_series(store: ResultsStore, study: str | None) -> pd.DataFrame:
    """Per complete run and global step (pooled over ranks): hits and remote rows."""
    return store.query(f"""
        SELECT r.run_id, r.dataset, r.machines, r.policy, m.global_step AS step,
               sum(m.hits) AS hits, sum(m.remote_rows) AS remote_rows
        FROM minibatches m JOIN {runs_relation(study)} r USING (run_id)
        WHERE r.status = 'complete' AND m.global_step IS NOT NULL
        GROUP BY ALL ORDER BY r.run_id, step""")


def _binned(df: pd.DataFrame, hits: str, remote: str, width: int) -> pd.DataFrame:
    """%-hits per bin of `width` global steps (pooled)."""
    b = df.assign(bin=(df["step"] // width) * width + (width - 1) / 2.0)
    g = b.groupby("bin", as_index=False)[[hits, remote]].sum()
    g["hit_pct"] = 100.0 * g[hits] / g[remote].where(g[remote] > 0)
    return g


def _width(steps: pd.Series) -> int:
    top = int(steps.max()) + 1 if len(steps) else 1
    return max(1, math.ceil(top / HIT_RATE_POINTS))


# --- markdown -----------------------------------------------------------------------------------
def fmt_cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    if v is pd.NA or v is pd.NaT:
        return "–"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(df) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt_cell(v) for v in row) + " |")
    return "\n".join(lines)


# --- plots --------------------------------------------------------------------------------------
def _figure(nrows: int, ncols: int, width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def save(fig, path: Path) -> None:
    fig.savefig(path, dpi=110, bbox_inches="tight")


def _legend_below(ax, y: float = -0.1) -> None:
    """The panel's legend under its axes, where it covers no bar, label or curve."""
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, y), ncols=3, frameon=False)


def savings_figure(vs: pd.DataFrame, bel_runs: pd.DataFrame):
    """Two panels per dataset: rows fetched / none and epoch time / none, bars per policy in
    groups by machine count; marks: Belady's rows (left: all remote nodes, black dashed, the
    yardstick; halo only, grey dotted), the features-free bound (right)."""
    datasets = list(dict.fromkeys(vs["dataset"]))
    fig, axes = _figure(len(datasets), 2, 5.6, 4.0)
    for row, ds in zip(axes, datasets):
        part = vs[(vs["dataset"] == ds) & (vs["policy"] != "none")]
        part = part[~part["simulated"].fillna(False).astype(bool)] if \
            (~part["simulated"].fillna(False).astype(bool)).any() else part
        pols = _policies(part)
        ms = sorted(int(m) for m in part["machines"].dropna().unique())
        width = 0.8 / max(1, len(pols))
        for ax, col, title, mark in (
                (row[0], "rows_ratio", "remote rows fetched", "belady"),
                (row[1], "epoch_ratio", "epoch time", "bound")):
            for i, pol in enumerate(pols):
                g = part[part["policy"] == pol].set_index("machines")
                xs = [j + (i - (len(pols) - 1) / 2) * width for j in range(len(ms))]
                ys = [float(g.loc[m, col]) if m in g.index and pd.notna(g.loc[m, col])
                      else float("nan") for m in ms]
                bars = ax.bar(xs, ys, width * 0.95, label=pol, color=COLORS.get(pol))
                for rect, y in zip(bars, ys):
                    if not math.isnan(y):
                        ax.annotate(f"{y:.2f}", (rect.get_x() + rect.get_width() / 2, y),
                                    ha="center", va="bottom", fontsize=7)
            labelled = set()
            for j, m in enumerate(ms):
                marks = []  # (name, y, colour, line style)
                if mark == "belady" and not bel_runs.empty:
                    marks = [(BELADY[u], belady_rows_ratio(bel_runs, ds, m, u), c, ls)
                             for u, c, ls in (("all", "black", "--"), ("halo", "0.5", ":"))]
                elif mark == "bound":
                    n = vs[(vs["dataset"] == ds) & (vs["machines"] == m) & (vs["policy"] == "none")]
                    y = (float(n.iloc[0].bound_s / n.iloc[0].epoch_s)
                         if not n.empty and n.iloc[0].bound_s else None)
                    marks = [("features-free bound", y, "black", "--")]
                for name, y, color, ls in marks:
                    if y is not None:
                        ax.hlines(y, j - 0.45, j + 0.45, colors=color, linestyles=ls, zorder=3,
                                  label=None if name in labelled else name)
                        labelled.add(name)
            ax.axhline(1.0, color="0.3", lw=1, label="DistDGL (none) = 1")
            ax.set_xticks(range(len(ms)), [f"{m} machines" for m in ms])
            ax.set_ylabel(f"{title} / none (lower is better)")
            ax.set_title(f"{ds}: {title} vs DistDGL (none)")
            ax.set_ylim(0, max(1.25, float(part[col].max(skipna=True) or 1) * 1.15))
            ax.grid(axis="y", alpha=0.3)
            _legend_below(ax)  # inside, it covered the tallest bars' labels (the worst policy's)
    fig.tight_layout()
    return fig


def hit_rate_figure(hits: pd.DataFrame, bel_runs: pd.DataFrame, bel_steps: pd.DataFrame):
    """One panel per (dataset, machines): %-hits over training per policy, and both Belady's
    on the same minibatches (pooled over the buffered runs of the panel)."""
    # a replay (rudder sim) may not know its machine count: one "?" panel (-1), not one per NaN
    hits = hits.assign(machines=hits["machines"].fillna(-1))
    bel_runs = bel_runs.assign(machines=bel_runs["machines"].fillna(-1)) if not bel_runs.empty else bel_runs
    keys = list(dict.fromkeys(zip(hits["dataset"], hits["machines"])))
    ncols = min(2, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = _figure(nrows, ncols, 6.0, 3.8)
    flat = axes.ravel()
    for ax in flat[len(keys):]:
        ax.set_visible(False)
    for ax, (ds, m) in zip(flat, keys):
        part = hits[(hits["dataset"] == ds) & (hits["machines"] == m)]
        width = _width(part["step"])
        for pol in _policies(part):
            if pol == "none":  # no buffer: 0% throughout
                continue
            g = _binned(part[part["policy"] == pol], "hits", "remote_rows", width)
            ax.plot(g["bin"], g["hit_pct"], label=pol, color=COLORS.get(pol), lw=1.6)
        if not bel_steps.empty and not bel_runs.empty:
            ids = bel_runs[(bel_runs["dataset"] == ds) & (bel_runs["machines"] == m)
                           & (bel_runs["policy"] != "none")]["run_id"]
            _plot_belady(ax, bel_steps[bel_steps["run_id"].isin(ids)], width)
        ax.set_title(f"{ds}, {'?' if m < 0 else int(m)} machines: hit rate over training")
        ax.set_xlabel("minibatch (global step of each trainer)")
        ax.set_ylabel("%-hits (buffer hits / remote rows)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        _legend_below(ax, y=-0.14)  # inside, it hid the low curves (fixed, static)
    fig.tight_layout()
    return fig


def _plot_belady(ax, bs: pd.DataFrame, width: int) -> None:
    """Both Belady's %-hits over training (pooled over the given runs' ranks): all remote nodes
    (the yardstick, black dashed), halo only (grey dotted)."""
    if bs.empty:
        return
    cols = ["belady_all_hits", "belady_halo_hits", "remote_rows"]
    bs = bs.groupby("global_step", as_index=False)[cols].sum().rename(
        columns={"global_step": "step"})
    for u, color, ls in (("all", "black", "--"), ("halo", "0.5", ":")):
        g = _binned(bs, f"belady_{u}_hits", "remote_rows", width)
        ax.plot(g["bin"], g["hit_pct"], label=BELADY[u], color=color, ls=ls, lw=1.4)


def decisions_figure(decisions: pd.DataFrame, hits: pd.DataFrame, bel_runs: pd.DataFrame,
                     bel_steps: pd.DataFrame):
    """One panel per agent run: its %-hits over training (and both Belady's on its trace), with
    each decision on that timeline (▲ replace, ● keep at the step it was applied; hollow:
    never applied; ✕ fallback at the step it was asked), numbered, and the stretch the fallback
    steered shaded; the reasons listed under the panel. Returns (figure, panels drawn)."""
    runs = list(dict.fromkeys(decisions["run_id"]))[:MAX_DECISION_PANELS]
    fig, axes = _figure(len(runs), 1, 11.0, 4.6)
    for ax, run_id in zip(axes[:, 0], runs):
        d = decisions[decisions["run_id"] == run_id]
        d = d.assign(_at=d["applied_step"].fillna(d["decided_step"])).sort_values(
            ["_at", "rank"], kind="stable").reset_index(drop=True)  # numbered left to right
        h = hits[hits["run_id"] == run_id]
        width = _width(h["step"]) if not h.empty else 1
        if not h.empty:
            g = _binned(h, "hits", "remote_rows", width)
            ax.plot(g["bin"], g["hit_pct"], color=COLORS["agent"], lw=1.6, label="agent %-hits")
        if not bel_steps.empty:
            _plot_belady(ax, bel_steps[bel_steps["run_id"] == run_id], width)
        fb = d["fallback"].astype("boolean").fillna(False).to_numpy(bool)
        rep = d["replace"].astype("boolean")
        first = first_applied(d)
        end = first if first is not None else (float(h["step"].max()) if not h.empty else None)
        if end is not None:
            ax.axvspan(-0.5, end, color="0.92", zorder=0,
                       label="fallback steers (no answer applied yet)")
        reasons: dict[str, list[int]] = {}
        for i, r in d.iterrows():
            num = i + 1
            if fb[i]:
                x, style, name = r.decided_step, dict(marker="x", color="tab:red", s=55), \
                    "fallback (no usable answer)"
                why = _plain_reason(r.reason).removeprefix("fallback: ")
                reasons.setdefault(f"fallback: {textwrap.shorten(why, 70)}", []).append(num)
            else:
                applied = pd.notna(r.applied_step)
                x = r.applied_step if applied else r.decided_step
                is_rep = bool(rep.iloc[i]) if pd.notna(rep.iloc[i]) else False
                color = "tab:green" if is_rep else "0.4"
                style = dict(marker="^" if is_rep else "o", s=60,
                             facecolors=color if applied else "none", edgecolors=color)
                name = ("replace" if is_rep else "keep") + ("" if applied else " (not applied)")
                budget = f" ({r.budget})" if is_rep and pd.notna(r.budget) else ""
                late = "" if applied else " (never applied)"
                cf = r.get("correct_cf")  # judged against its counterfactual, where it was
                verdict = "" if cf is None or pd.isna(cf) else (" [right]" if cf else " [wrong]")
                reasons.setdefault(f"{'replace' if is_rep else 'keep'}{budget}{late}{verdict}: "
                                   f"“{_plain_reason(r.reason)}”", []).append(num)
            if pd.isna(x):
                continue
            x = max(float(x), -0.5)  # the start decision: before the first minibatch
            ax.scatter([x], [103], zorder=3, clip_on=False,
                       label=name if name not in ax.get_legend_handles_labels()[1] else None,
                       **style)
            ax.annotate(str(num), (x, 103), xytext=(0, 6), textcoords="offset points",
                        ha="center", fontsize=7, annotation_clip=False)
            ax.axvline(x, color="0.8", lw=0.8, zorder=0)
        first = d.iloc[0]
        ax.set_title(f"agent run {run_id} ({first.dataset}, {int(first.machines)} machines): "
                     "decisions on the hit-rate timeline", fontsize=10, pad=22)
        ax.set_xlabel("minibatch (global step of each trainer; decision marks at the step "
                      "applied)")
        ax.set_ylabel("%-hits")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right", ncols=2)
        lines = [f"{_nums(nums)}: {text}" for text, nums in reasons.items()]
        if lines:
            wrapped = "\n".join(textwrap.shorten(t, 150) for t in lines[:8])
            judged = (f" ([right] / [wrong]: judged against its counterfactual"
                      f"{_over_windows(d)};\n no mark: too close to call, or applied too "
                      "near the run's end)") if "correct_cf" in d and d["correct_cf"].notna().any() else ""
            # a fixed offset below the axes (under the x label), whatever height tight_layout
            # leaves the panel for this many lines
            ax.annotate(f"Decisions and reasons{judged}:\n" + wrapped, (0.0, 0.0), xycoords="axes fraction",
                        xytext=(0, -30), textcoords="offset points", va="top", ha="left", fontsize=8,
                        family="monospace", annotation_clip=False)
    fig.tight_layout()
    return fig, len(runs)


def _plain_reason(reason) -> str:
    """The model's reason without the notes the policy appends ("[superseded, never
    applied]", "[arrived after the run, never applied]"): those are counted apart."""
    text = "" if reason is None or (isinstance(reason, float) and math.isnan(reason)) \
        else str(reason)
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", text) or "(no reason)"


def _nums(nums: list[int]) -> str:
    if len(nums) > 6:
        return "#" + ",".join(map(str, nums[:5])) + f",… ({len(nums)}×)"
    return "#" + ",".join(map(str, nums))
