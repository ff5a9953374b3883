"""A Markdown report of a results database: the named queries as tables, and PNG plots.

    report.md          overview, speedup, remote rows, hit rate, decisions, failed runs
    epoch_time.png     mean epoch time vs machines, one line per policy (one panel per dataset)
    remote_rows.png    rows fetched per epoch vs machines, one line per policy
    hit_rate.png       %-hits over training (global_step), one line per policy
    decisions.png      policy decisions over steps per run/rank: replace yes/no, fallback marked

Plots are drawn on matplotlib Figures with the Agg canvas directly (no pyplot), so importing
this module changes no global backend. Empty tables give a sentence instead of a plot.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

from rudder.results.queries import NAMED, run_named, runs_relation
from rudder.results.store import ResultsStore

PLOTS = ("epoch_time.png", "remote_rows.png", "hit_rate.png", "decisions.png")
MAX_LANES = 12  # decision timeline: (run, rank) lanes drawn; more are listed as left out
HIT_RATE_BINS = 200  # global_step bins of the hit-rate curve


def write_report(db_path: str | Path = "results.duckdb", out_dir: str | Path = "report",
                 study: str | None = None) -> Path:
    """Writes `out_dir/report.md` and its PNG plots; returns the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in PLOTS:  # a plot not drawn this time must not linger from an earlier report
        (out / name).unlink(missing_ok=True)
    with ResultsStore(db_path, read_only=True) as store:
        tables = {name: run_named(store, name, study) for name in NAMED}
        status = store.query(
            f"SELECT status, count(*) AS runs FROM {_runs(study)} GROUP BY status ORDER BY status")
        hits = _hit_rate_series(store, study)
        decisions = store.query(render_decisions(study))

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

    md += ["## Epoch time", "", NAMED["speedup"].description + ".", ""]
    sp = tables["speedup"]
    if sp.empty:
        md += ["No complete runs with epoch records.", ""]
    else:
        md += [_md_table(sp), ""]
        _line_plot(sp, "mean_epoch_s", "mean epoch time (s)", out / "epoch_time.png",
                   err="std_epoch_s")
        md += ["![epoch time vs machines](epoch_time.png)", ""]

    md += ["## Remote rows fetched", "", NAMED["remote_rows"].description + ".", ""]
    rr = tables["remote_rows"]
    if rr.empty:
        md += ["No complete runs with epoch records.", ""]
    else:
        md += [_md_table(rr), ""]
        _line_plot(rr, "fetched_rows_per_epoch", "rows fetched per epoch (all ranks)",
                   out / "remote_rows.png")
        md += ["![remote rows vs machines](remote_rows.png)", ""]

    md += ["## Hit rate", "", NAMED["hit_rate"].description + ".", ""]
    hr = tables["hit_rate"]
    md += [_md_table(hr) if not hr.empty else "No complete runs with epoch records.", ""]
    if not hits.empty:
        _hit_rate_plot(hits, out / "hit_rate.png")
        md += ["![hit rate over training](hit_rate.png)", ""]
    else:
        md += ["No minibatch records to draw the hit rate over time.", ""]

    md += ["## Agent decisions", ""]
    if decisions.empty:
        md += ["No agent runs: no decision records in the database.", ""]
    else:
        md += ["### Pass@1", "", NAMED["pass_at_1"].description + ".", "",
               _md_table(tables["pass_at_1"]), "",
               _pass_line(tables["pass_at_1"]), "",
               "### Staleness", "", NAMED["staleness"].description + ".", "",
               _md_table(tables["staleness"]), ""]
        shown = _decision_plot(decisions, out / "decisions.png")
        md += ["![decision timeline](decisions.png)", ""]
        lanes = decisions.groupby(["run_id", "rank"]).ngroups
        if shown < lanes:
            md += [f"The timeline shows {shown} of {lanes} run/rank lanes.", ""]

    md += ["## Failed runs", ""]
    fr = tables["failed_runs"]
    md += [_md_table(fr) if not fr.empty else "None: every collected run completed.", ""]

    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def _pass_line(p) -> str:
    """All decisions: Pass@1 before/after beside the counterfactual's (correct_cf)."""
    def share(ok: str, n: str) -> str:
        total = int(p[n].sum())
        return f"{int(p[ok].sum()) / total:.2f} ({total} judged)" if total else "not judged"
    return (f"Pass@1 of all decisions: before/after {share('correct', 'evaluated')}, "
            f"counterfactual {share('correct_cf', 'evaluated_cf')} (`rudder agent judge RUN_DIR`).")


# --- data ---------------------------------------------------------------------------------------
def _runs(study: str | None) -> str:
    return runs_relation(study)  # the same runs relation the named queries use


def render_decisions(study: str | None = None) -> str:
    """SQL of the decision timeline: one row per decision, with its run's key config."""
    return f"""
        SELECT d.run_id, d.rank, r.dataset, r.machines, d.policy, d.model,
               coalesce(d.decided_step, d.applied_step) AS step, d.replace, d.fallback,
               d.correct
        FROM decisions d JOIN {_runs(study)} r USING (run_id)
        ORDER BY d.run_id, d.rank, step"""


def _hit_rate_series(store: ResultsStore, study: str | None):
    runs = f"(SELECT * FROM {_runs(study)} WHERE status = 'complete')"
    top = store.scalar(f"SELECT max(m.global_step) FROM minibatches m JOIN {runs} r "
                       "USING (run_id)")
    if top is None:
        return store.query("SELECT NULL AS dataset WHERE false")
    width = max(1, math.ceil((int(top) + 1) / HIT_RATE_BINS))
    return store.query(f"""
        SELECT r.dataset, r.policy, (m.global_step // {width}) * {width} AS step,
               coalesce(sum(m.hits) / nullif(sum(m.remote_rows), 0), avg(m.hit_rate))
                 AS hit_rate
        FROM minibatches m JOIN {runs} r USING (run_id)
        WHERE m.global_step IS NOT NULL
        GROUP BY ALL ORDER BY r.dataset, r.policy, step""")


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
    try:
        import pandas as pd

        if v is pd.NA or v is pd.NaT:
            return "–"
    except ImportError:  # pragma: no cover
        pass
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(df) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt_cell(v) for v in row) + " |")
    return "\n".join(lines)


# --- plots --------------------------------------------------------------------------------------
def _figure(panels: int, height: float = 3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ncols = min(panels, 3)
    nrows = math.ceil(panels / ncols)
    fig = Figure(figsize=(5.0 * ncols, height * nrows))
    fig.subplots_adjust(wspace=0.3, hspace=0.45)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes


def _label(policy, simulated) -> str:
    return f"{policy} (sim)" if bool(simulated) and simulated is not None else str(policy)


def _line_plot(df, y: str, ylabel: str, path: Path, err: str | None = None) -> None:
    datasets = list(dict.fromkeys(df["dataset"]))
    fig, axes = _figure(len(datasets))
    for ax, ds in zip(axes, datasets):
        part = df[df["dataset"] == ds]
        for (policy, sim), g in part.groupby(["policy", "simulated"], sort=True, dropna=False):
            g = g.sort_values("machines")
            yerr = g[err].fillna(0).to_numpy() if err else None
            ax.errorbar(g["machines"], g[y], yerr=yerr, marker="o", capsize=3,
                        label=_label(policy, sim))
        ax.set_title(str(ds))
        ax.set_xlabel("machines")
        ax.set_ylabel(ylabel)
        ms = sorted(set(part["machines"].dropna().astype(int)))
        if ms:
            ax.set_xticks(ms)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=100, bbox_inches="tight")


def _hit_rate_plot(df, path: Path) -> None:
    datasets = list(dict.fromkeys(df["dataset"]))
    fig, axes = _figure(len(datasets))
    for ax, ds in zip(axes, datasets):
        part = df[df["dataset"] == ds]
        for policy, g in part.groupby("policy", sort=True, dropna=False):
            ax.plot(g["step"], 100.0 * g["hit_rate"].astype(float), label=str(policy))
        ax.set_title(str(ds))
        ax.set_xlabel("global step (minibatches)")
        ax.set_ylabel("%-hits")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=100, bbox_inches="tight")


def _decision_plot(df, path: Path) -> int:
    """One lane per (run, rank); returns how many lanes were drawn."""
    lanes = list(df.groupby(["run_id", "rank"], sort=True).groups)[:MAX_LANES]
    fig, axes = _figure(1, height=max(2.0, 0.45 * len(lanes) + 1.2))
    ax = axes[0]
    fig.set_figwidth(10)
    labels = []
    seen = set()
    for i, (run_id, rank) in enumerate(lanes):
        g = df[(df["run_id"] == run_id) & (df["rank"] == rank)]
        model = g["model"].dropna().iloc[0] if g["model"].notna().any() else g["policy"].iloc[0]
        labels.append(f"{run_id} r{rank} ({model})")
        rep = g["replace"].astype("boolean")
        for mask, style, name in (
            (rep.fillna(False).to_numpy(bool), dict(marker="^", color="tab:green", s=36),
             "replace"),
            ((~rep).fillna(False).to_numpy(bool), dict(marker="o", color="0.65", s=18),
             "keep"),
            (rep.isna().to_numpy(bool), dict(marker=".", color="0.3", s=18), "no answer"),
        ):
            if mask.any():
                ax.scatter(g["step"][mask], [i] * int(mask.sum()), zorder=2,
                           label=None if name in seen else name, **style)
                seen.add(name)
        fb = g["fallback"].astype("boolean").fillna(False).to_numpy(bool)
        if fb.any():
            ax.scatter(g["step"][fb], [i] * int(fb.sum()), marker="x", color="tab:red", s=60,
                       zorder=3, label=None if "fallback" in seen else "fallback")
            seen.add("fallback")
    ax.set_yticks(range(len(lanes)), labels, fontsize="small")
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    ax.invert_yaxis()
    ax.set_xlabel("step decided (global minibatch)")
    ax.set_title("policy decisions")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return len(lanes)
