"""The few lines `rudder run` ends with: what the buffer saved, against `none` and Belady.

Read from the run directory alone (records, traces, done files), so it is the same for a run
made by the CLI, by a study, or copied from elsewhere.
"""
from __future__ import annotations

import json
from pathlib import Path

from rudder.records import read_jsonl

# policies whose decisions are the point of the run (a run where they never acted says so)
DECIDING = ("agent", "classifier", "collect")


def _ranks(run_dir: Path, stem: str) -> list[Path]:
    return sorted(run_dir.glob(f"{stem}-r*.jsonl"), key=lambda p: int(p.stem.rsplit("-r", 1)[1]))


def _by_rank(run_dir: Path, stem: str) -> dict[int, list[dict]]:
    return {int(p.stem.rsplit("-r", 1)[1]): read_jsonl(p) for p in _ranks(run_dir, stem)}


def summarize_run(run_dir: str | Path) -> dict:
    """Totals over every rank: remote rows (what `none` pulls), fetched rows, hits, Belady's
    hits on the recorded traces (halo only, and over all remote nodes, at the run's capacity),
    mean epoch time (slowest rank) and its compute-only and pipeline bounds (rudder.bounds),
    decisions, feature check."""
    from rudder.bounds import run_bounds
    from rudder.config import stored_policy
    from rudder.sim.oracle import belady
    from rudder.trace import Trace, find_traces

    run_dir = Path(run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    policy = stored_policy(run.get("config") or {}) or "?"  # `free`: train.features_free
    mbs_by_rank, epochs_by_rank = _by_rank(run_dir, "minibatches"), _by_rank(run_dir, "epochs")
    mbs = [m for v in mbs_by_rank.values() for m in v]
    epochs = [e for v in epochs_by_rank.values() for e in v]
    out: dict = {"policy": policy, "minibatches": len(mbs),
                 "remote_rows": sum(m["remote_rows"] for m in mbs),
                 "fetched_rows": sum(m["fetched_rows"] for m in mbs),
                 "hits": sum(m["hits"] for m in mbs),
                 "initial_fill_rows": sum(e.get("initial_fill_rows") or 0 for e in epochs if e["epoch"] == 0)}
    traces = find_traces(run_dir)
    if traces:  # `none` pulls every remote access of the trace; Belady with the run's capacity
        loaded = [Trace.load(p) for p in traces.values()]
        out["none_rows"] = sum(t.num_accesses for t in loaded)
        buffered = policy not in ("none", "free")  # no buffer: no optimum to set it beside
        out["belady_hits"] = sum(belady(t).total_hits for t in loaded) if buffered else 0
        out["belady_all_hits"] = (sum(belady(t, universe="all").total_hits for t in loaded)
                                  if buffered else 0)
    per_epoch: dict[int, float] = {}
    for e in epochs:
        per_epoch[e["epoch"]] = max(per_epoch.get(e["epoch"], 0.0), e["t_epoch"])
    out["epochs"] = len(per_epoch)
    out["epoch_s"] = sum(per_epoch.values()) / len(per_epoch) if per_epoch else None
    b = run_bounds(mbs_by_rank, epochs_by_rank)
    out["bounds"] = {k: v for k, v in b.to_dict().items() if k != "per_epoch"} if mbs else None
    # where the cores went: the trainers' own CPU per epoch (all ranks), and the whole run's by role
    cpu = [e.get("cpu_s") for e in epochs]
    out["cpu_epoch_s"] = sum(cpu) / len(per_epoch) if cpu and None not in cpu else None
    out["cpu_by_role"] = role_cpu(run_dir)
    decisions = [d for p in _ranks(run_dir, "decisions") for d in read_jsonl(p)]
    out["decisions"] = len(decisions)
    out["applied"] = sum(1 for d in decisions if d.get("applied_step") is not None and not d.get("fallback"))
    out["fallbacks"] = sum(1 for d in decisions if d.get("fallback"))
    out["replace"] = sum(1 for d in decisions if d.get("replace") and not d.get("fallback")
                         and d.get("applied_step") is not None)
    out["judge"] = run.get("judge")  # the decisions against their counterfactual (runner.judge_decisions)
    done = [json.loads(p.read_text()) for p in sorted(run_dir.glob("done-r*.json"))]
    if any(d.get("checked") for d in done):
        out["feature_check"] = {"ranks": sum(1 for d in done if d.get("checked")),
                                "mismatched_rows": sum(d.get("mismatched_rows") or 0 for d in done)}
    else:
        out["feature_check"] = None
    # train.pulls_in_flight > 1: how many were on the wire at once, and over how many epoch ends
    most = max((d.get("most_pulls_in_flight") or 0 for d in done), default=0)
    out["pulls"] = ({"most_in_flight": most,
                     "epoch_ends": max(d.get("epoch_ends_in_flight") or 0 for d in done)}
                    if most > 1 else None)
    return out


def role_cpu(run_dir: str | Path) -> dict[str, tuple[float, float]]:
    """{role: (user + sys, sys)} CPU seconds of the whole run, summed over the machines, from the
    supervisors' status files (rudder.cluster.machine: each process as it was reaped, a trainer
    with the sampler processes it waited for); {} where none recorded it (a replay)."""
    out: dict[str, list[float]] = {}
    for p in sorted((Path(run_dir) / "cluster").glob("machine*.status.json")):
        for proc in json.loads(p.read_text()).get("procs", []):
            if "cpu_user_s" in proc:
                got = out.setdefault(proc["role"], [0.0, 0.0])
                got[0] += proc["cpu_user_s"] + proc["cpu_sys_s"]
                got[1] += proc["cpu_sys_s"]
    return {k: (v[0], v[1]) for k, v in out.items()}


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "n/a"


def _cpu_line(s: dict) -> str | None:
    """The trainers' CPU an epoch (as cores busy for the epoch's time) and the run's by role."""
    parts = []
    if s.get("cpu_epoch_s") is not None and s.get("epoch_s"):
        parts.append(f"trainers {s['cpu_epoch_s']:.2f} CPU-s an epoch "
                     f"({s['cpu_epoch_s'] / s['epoch_s']:.2f} cores over its {s['epoch_s']:.2f} s)")
    roles = s.get("cpu_by_role") or {}
    if roles:
        names = {"trainer": "trainers with samplers", "server": "servers", "service": "services",
                 "store": "rendezvous store"}
        parts.append("whole run: " + ", ".join(f"{names.get(r, r)} {t:.1f} s (sys {k:.1f})"
                                              for r, (t, k) in sorted(roles.items())))
    return "cpu            " + "; ".join(parts) if parts else None


def _judge_line(j: dict) -> str:
    if j.get("error"):
        return f"judged         none: {j['error']}"
    right, n = j["pass_at_1_cf"]  # n: the judged decisions whose saving was clear enough to call
    h = j["horizon"]
    if not j["judged"]:
        return (f"judged         none of {j['decisions']} decisions: each fell back, was never "
                f"applied, or came in the run's last {h} windows (the counterfactual replays {h})")
    return (f"judged         {j['judged']} of {j['decisions']} decisions against their counterfactual "
            f"over {h} windows (not fallbacks, nor those in the last {h} windows): "
            + (f"{right} of {n} clear calls right (Pass@1 {right / n:.2f})" if n else "none clear enough to call")
            + "; `rudder agent judge --horizon N RUN_DIR` judges over another horizon")


def format_summary(s: dict) -> str:
    base = s["policy"].split(":", 1)[0]
    none_rows = s.get("none_rows", s["remote_rows"])
    if base == "free":  # nothing pulled or buffered: rows and hits would read 0
        lines = ["features free  no remote row pulled (train.features_free): the epoch time below "
                 "is the features-free bound of this sampling, measured; accuracy means nothing"]
    else:
        best = s.get("belady_all_hits") or s.get("belady_hits")  # the unrestricted optimum if known
        lines = [
            f"rows fetched   {s['fetched_rows']:,} = {_pct(s['fetched_rows'], none_rows)} of the "
            f"{none_rows:,} remote rows `none` pulls"
            + (f" (+ {s['initial_fill_rows']:,} initial fill)" if s["initial_fill_rows"] else ""),
            f"buffer hits    {s['hits']:,} ({_pct(s['hits'], s['remote_rows'])} of remote rows)"
            + (f"; Belady on the same traces: {best:,} (run/optimal {s['hits'] / best:.3f})" if best else ""),
        ]
    if s.get("belady_all_hits"):
        # the optimum above is over every remote node (the yardstick); the halo-only one is the
        # optimum of a buffer of 1-hop halo nodes, which a buffer of any remote id may pass
        lines.append(f"Belady         all remote nodes {s['belady_all_hits']:,} hits, halo only "
                     f"{s.get('belady_hits', 0):,} (same capacity; run/halo only "
                     f"{s['hits'] / max(s.get('belady_hits') or 0, 1):.3f})")
    if s["epoch_s"] is not None:
        lines.append(f"epoch time     {s['epoch_s']:.2f} s (mean of {s['epochs']} epoch(s), slowest rank)")
    b = s.get("bounds")
    if b and b["epoch_s"] is not None and b["pipeline_s"] and b["compute_s"]:
        lines.append(f"bounds         pipeline {b['pipeline_s']:.2f} s (epoch {b['epoch_over_pipeline']:.2f}x), "
                     f"compute-only {b['compute_s']:.2f} s (epoch {b['epoch_over_compute']:.2f}x)")
    cpu_line = _cpu_line(s)
    if cpu_line:
        lines.append(cpu_line)
    if base in DECIDING or s["decisions"]:
        lines.append(f"decisions      {s['decisions']}: {s['applied']} applied ({s['replace']} replace), "
                     f"{s['fallbacks']} fell back")
        if base in DECIDING and s["applied"] == 0:
            who = "the agent" if base == "agent" else f"the {base} policy"
            lines.append(f"note           {who} never acted: "
                         + ("every decision fell back" if s["decisions"] else "no decision was made")
                         + " (see decisions-r*.jsonl and logs/)")
    j = s.get("judge")
    if j:
        lines.append(_judge_line(j))
    if s.get("pulls"):
        p = s["pulls"]
        lines.append(f"pulls          up to {p['most_in_flight']} in flight at once (train.pulls_in_flight); "
                     f"{p['epoch_ends']} epoch end(s) crossed with one on the wire")
    fc = s["feature_check"]
    lines.append("feature check  " + (f"{fc['ranks']} rank(s), {fc['mismatched_rows']} rows differ"
                                      if fc else "not run (--check verifies every assembled row)"))
    return "\n".join(lines)
