"""The signals a prompt shows of a metrics window, as numbers and as the words prompts use
(issue 18): the hit-rate and fetched-rows trends, stale shares, link slack, what the sampled-ahead
minibatches lack and its drift, the misses' overlap (`window_signals`), the evidence form the
examples' reasons take (`evidence`), and the past counterfactual -- what a round at the last window
close would have done to the window just closed, measured by rudder.prefetch.past
(`past_counterfactual`, `past_line`). rudder.agent.context renders them into prompts; the judge,
the example pool and the benchmarks read the same numbers.
"""
from __future__ import annotations

from typing import Any, Iterable

from rudder.agent.messages import ADMITS, BUDGET_SHARE, EVICT_WORDS, budget_rows
from rudder.records import HIT_TOL, direction

# Below this share of capacity missing ahead, a lookahead round has little to admit (the rule of
# thumb in the system message, and where a kept window is a trustworthy keep example).
LOOKAHEAD_SMALL = 0.05
TREND_WINDOWS = 4  # the hit-rate trend: least-squares slope over this many windows (current included)

# the past counterfactual's rounds: MassiveGNN rounds (budget x evict), lookahead rounds (budget x admit)
LOOKAHEAD_PAST_ORDER = [(b, a) for a in ADMITS for b in BUDGET_SHARE]
PAST_ORDER = [(b, e) for e in EVICT_WORDS for b in BUDGET_SHARE]
# the labels of Policy.past_rounds (rudder.agent.steering.past_rounds): MassiveGNN, then lookahead
PAST_LABELS = [f"{b}_{x}" for b, x in PAST_ORDER + LOOKAHEAD_PAST_ORDER]


def per_minibatch(window: dict, key: str) -> float | None:
    v = window.get(key)
    if v is None:
        return None
    return float(v) / max(1, int(window.get("minibatches") or 1))


def pct_text(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def num_text(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def window_signals(w: dict, recent: Iterable[float | dict] = (), capacity: int = 0,
                   lookahead: bool = True) -> dict[str, Any]:
    """The judge variant's signals of window `w` (recent: earlier windows, oldest first, as dicts
    or hit rates), as numbers (None where the window does not tell):
      hit_rate, hit_rates (the last TREND_WINDOWS, current last), trend_windows,
      hit_trend_pt   least-squares slope of those hit rates, points per window
      stale_share    stale slots / capacity
      fetch_s, compute_s, slack_s, slack_share
                     mean seconds per minibatch of the pull (t_fetch) and of the rest
                     (t_minibatch - t_fetch: compute and sampling); slack = compute - fetch
                     (< 0: saturated), slack_share = slack / compute
      missing_share  lookahead_missing / capacity (lookahead on)
      drift_pt       missing_share minus the window before's, points of capacity
      fetched_mb     fetched rows per minibatch (misses + rows admitted)
      rows_trend_pct least-squares slope of fetched rows per minibatch over the same windows as
                     the hit-rate trend, % of their mean per window (the miss volume's trend)
      remote_mb, remote_drift_pct
                     remote input rows per minibatch, and its change since the window before in %
                     (the stream's drift where nothing is sampled ahead: a new region of the graph
                     shows as more or fewer remote rows before any hit rate moves)
      round_rows     {budget word: the rows one round may pull}, and round_mb: the same in
                     minibatches' worth of this window's fetched rows -- what a round costs where
                     its rows are extra network rows (lookahead off); None with lookahead on
      missed_nodes, miss_again_share, miss_overlap
                     the misses' node sets (HaloBuffer.roll_misses): distinct halo nodes missed in
                     the window, the share of them missed in the window before too, and the
                     Jaccard overlap of the two windows' missed sets (None without a window
                     before, or where the window record does not carry them)."""
    cap = max(1, capacity)
    recent = list(recent)
    rates = [r.get("hit_rate") if isinstance(r, dict) else r for r in recent]
    hr = w.get("hit_rate")
    hist = [x for x in rates if x is not None][-(TREND_WINDOWS - 1):]
    trend = None
    series = hist + ([hr] if hr is not None else [])
    if hr is not None and hist:
        trend = 100 * _slope(series)
    fetch, mb = w.get("t_fetch"), w.get("t_minibatch")
    fetch_s = compute_s = slack_s = slack_share = None
    if fetch is not None and mb:  # a replay without a time model records no times (0)
        fetch_s, compute_s = float(fetch), float(mb) - float(fetch)
        slack_s = compute_s - fetch_s
        slack_share = slack_s / compute_s if compute_s > 0 else None
    missing = w.get("lookahead_missing") if lookahead else None
    missing_share = None if missing is None else missing / cap
    windows = [r for r in recent if isinstance(r, dict)]  # those that carry more than a hit rate
    last = windows[-1] if windows else {}  # the window before
    before = last.get("lookahead_missing")
    drift = None if missing_share is None or before is None else 100 * (missing_share - before / cap)
    stale = w.get("stale_slots")
    # rows: per minibatch, over the windows of the hit-rate trend (those that carry rows)
    fetched_mb, remote_mb = per_minibatch(w, "fetched_rows"), per_minibatch(w, "remote_rows")
    rows_series = [per_minibatch(r, "fetched_rows") for r in windows]
    rows_series = [x for x in rows_series if x is not None][-(TREND_WINDOWS - 1):]
    rows_trend = None
    if fetched_mb is not None and rows_series:
        ys = rows_series + [fetched_mb]
        mean = sum(ys) / len(ys)
        rows_trend = 100 * _slope(ys) / mean if mean > 0 else None
    remote_before = per_minibatch(last, "remote_rows")
    remote_drift = (100 * (remote_mb / remote_before - 1)
                    if remote_mb is not None and remote_before else None)
    round_rows = round_mb = None
    if not lookahead and capacity > 0:
        round_rows = {b: budget_rows(b, capacity) for b in BUDGET_SHARE}
        if fetched_mb:
            round_mb = {b: r / fetched_mb for b, r in round_rows.items()}
    missed, again, union = (w.get(k) for k in ("missed_nodes", "missed_again", "missed_union"))
    miss_again = miss_overlap = None
    if last and missed and union:  # a window before, and sets recorded (0 union: none missed)
        miss_again, miss_overlap = again / missed, again / union
    return {"hit_rate": hr, "hit_rates": series if hr is not None else [], "trend_windows": len(series),
            "hit_trend_pt": trend, "stale_share": None if stale is None else stale / cap,
            "fetch_s": fetch_s, "compute_s": compute_s, "slack_s": slack_s, "slack_share": slack_share,
            "missing_share": missing_share, "drift_pt": drift,
            "fetched_mb": fetched_mb, "rows_trend_pct": rows_trend, "remote_mb": remote_mb,
            "remote_drift_pct": remote_drift, "round_rows": round_rows, "round_mb": round_mb,
            "missed_nodes": missed or None, "miss_again_share": miss_again, "miss_overlap": miss_overlap}


# window_signals and the past counterfactual as one flat feature vector: the numbers the
# judge-history prompts show, for learners trained on counterfactual labels (classifiers trained
# with `--windows`, benchmarks/bench_signal_ceiling.py). "sig_" keeps them apart from
# rudder.agent.trajectories' FEATURE_NAMES, some of which share a word but not a meaning.
SIGNAL_FEATURES = [*(f"sig_past_{b}_{e}" for b, e in PAST_ORDER), "sig_past_best", "sig_hit_rate",
                   "sig_hit_trend_pt", "sig_stale_share", "sig_stale_half_share", "sig_miss_again_share",
                   "sig_miss_overlap", "sig_remote_drift_pct", "sig_rows_trend_pct"]


def signal_features(w: dict, recent: Iterable[dict] = (), capacity: int = 0) -> dict[str, float]:
    """SIGNAL_FEATURES of a history-only window (`recent`: the windows before it, oldest first);
    a signal the window does not tell is 0."""
    cap = max(1, capacity)
    s = window_signals(w, recent, capacity, lookahead=False)
    pc = past_counterfactual(w) or {}
    past = [pc.get(f"{b}/{e}", 0.0) for b, e in PAST_ORDER]
    half = w.get("stale_half")
    values = [*past, min(past), s["hit_rate"], s["hit_trend_pt"], s["stale_share"],
              None if half is None else half / cap, s["miss_again_share"], s["miss_overlap"],
              s["remote_drift_pct"], s["rows_trend_pct"]]
    return {n: 0.0 if v is None else float(v) for n, v in zip(SIGNAL_FEATURES, values)}


def _slope(ys: list[float]) -> float:
    """Least-squares slope of ys against 0, 1, 2, ... (per step)."""
    n = len(ys)
    xm, ym = (n - 1) / 2, sum(ys) / n
    return sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / sum((i - xm) ** 2 for i in range(n))


def trend_word(delta: float) -> str:
    """The hit-rate trend as prompts say it: rising / falling / steady (|delta| < HIT_TOL)."""
    return {"up": "rising", "down": "falling", "flat": "steady"}[direction(delta, HIT_TOL)]


def evidence(w: dict, prev: list[float | dict] | tuple = (), capacity: int = 0, lookahead: bool = True) -> str:
    """The reason an answer should start with: hit-rate trend, stale share, missing share.
    Small models copy the form of the examples' reasons; this form makes them copy the evidence
    of the current window (and then decide on it) rather than an example's conclusion."""
    cap = max(1, capacity)
    prev = [p.get("hit_rate") if isinstance(p, dict) else p for p in prev]
    prev = [p for p in prev if p is not None]
    parts = []
    hr = w.get("hit_rate")
    if hr is not None and prev:
        parts.append("hit rate " + trend_word(hr - prev[-1]))
    elif hr is not None:
        parts.append(f"hit rate {100 * hr:.0f}%")
    # the deciding facts last, right before the conclusion: the mechanism, then how much is missing
    parts.append("lookahead on" if lookahead else "lookahead off")
    if lookahead and w.get("lookahead_missing") is not None:
        parts.append(f"{missing_word(w['lookahead_missing'], cap)} missing ahead")
    return ", ".join(parts)


def missing_word(missing: float, capacity: int) -> str:
    """'much' when the next minibatches lack at least LOOKAHEAD_SMALL of capacity, else 'little'."""
    return "much" if missing >= LOOKAHEAD_SMALL * max(1, capacity) else "little"


def past_counterfactual(w: dict) -> dict[str, float] | None:
    """{"<budget>/<evict>" (MassiveGNN rounds) or "<budget>/<admit>" (lookahead rounds): change of the
    window's fetched rows had that decision been taken at its start, relative to no round
    (negative: saved rows)}, from the window's past counterfactual fields
    (rudder.prefetch.past); None where it has none."""
    keep = w.get("past_keep_fetched")
    if keep is None:
        return None
    out = {}
    for label in PAST_LABELS:
        v = w.get(f"past_fetched_{label}")
        if v is not None:
            out[label.replace("_", "/")] = (float(v) - keep) / max(1.0, float(keep))
    return out or None


def saved_text(x: float) -> str:
    return "no change" if abs(x) < 0.0005 else (f"saved {-100 * x:.1f}%" if x < 0 else f"cost {100 * x:.1f}%")


def past_line(w: dict) -> str | None:
    """The past counterfactual as the prompt shows it: every option, then the best one."""
    pc = past_counterfactual(w)
    if pc is None:
        return None
    best = min(pc, key=lambda k: (pc[k], list(pc).index(k)))
    n = int(w.get("past_windows") or 1)  # prefetch.past_windows: a round n - 1 windows before this one
    if all(k.endswith(("/misses", "/any")) for k in pc):  # lookahead rounds: one before every minibatch
        head = ("lookahead rounds before each of this window's minibatches (replayed) would have: " if n == 1 else
                f"lookahead rounds before each minibatch of the last {n} windows (replayed) would have: ")
    else:
        head = ("a round at this window's start (replayed on its minibatches) would have: " if n == 1 else
                f"a round {n} windows ago (replayed on the {n} windows since) would have: ")
    if w.get("past_round_slots") == 0:  # every round empty: not measured (rudder.prefetch.past.past_fields)
        return (head.removesuffix(" would have: ") + " would have swapped no slot (no node had been missed "
                "before it, or no slot was stale): what a round does is not measured yet")
    return (head + ", ".join(f"{k} {saved_text(v)}" for k, v in pc.items())
            + f" of {'its' if n == 1 else 'their'} fetched rows; best {best} {saved_text(pc[best])}")
