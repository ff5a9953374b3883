"""Scoring the agent offline: a model + prompt variant on a JSONL file of labelled windows.

A labelled window (one JSON object per line):
  context        RunContext-like dict (missing facts default to 0)
  window         a WINDOW_FIELDS record (the window just closed)
  recent         optional: earlier windows (dicts or hit rates), oldest first
  history        optional: past decisions with outcomes (HistoryEntry dicts)
  label_replace  bool: the right call
  source, kind   optional: where the window comes from, what it tests

Accuracy = share of windows where the answer's `replace` equals the label; a fallback (invalid,
truncated or late answer) counts as wrong and is also counted apart. Latency p50/p95 per model and
variant. The starter set (eval_windows.jsonl, made by `make_starter_windows`) holds simple,
unambiguous synthetic cases; `label_windows_from_run` labels windows of real runs.
"""
from __future__ import annotations

import json
import logging
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from rudder.agent.context import HIT_TOL, ContextBuilder, direction
from rudder.agent.decision import Backend, DecisionMaker, HttpBackend, InprocBackend, warm_prompt
from rudder.agent.judge import agrees
from rudder.agent.messages import HistoryEntry, budget_rows
from rudder.records import read_jsonl_strict, read_run

log = logging.getLogger(__name__)

STARTER = Path(__file__).with_name("eval_windows.jsonl")
# windows of replayed runs, labels confirmed by the counterfactual (scripts/make_eval_windows.py)
FROM_RUNS = Path(__file__).with_name("eval_windows_runs.jsonl")
DEFAULT_SETS = [STARTER, FROM_RUNS]  # what `rudder agent eval` reads without --windows


def load_windows(path: str | Path | list = STARTER) -> list[dict]:
    """Labelled windows of one file, or of several files in order (a packaged default set not
    built here is skipped; a file the caller names must exist)."""
    if isinstance(path, (list, tuple)):
        return [rec for p in path if p not in DEFAULT_SETS or Path(p).exists() for rec in load_windows(p)]
    if Path(path).is_dir():
        raise ValueError(f"{path} is a directory, not a labelled windows file (JSONL)")
    if not Path(path).exists():
        raise FileNotFoundError(f"no labelled windows file at {path}")
    out = []
    for i, rec in read_jsonl_strict(path, "a labelled window (JSON)"):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}:{i}: not a labelled window (a JSON object)")
        for k in ("context", "window", "label_replace"):
            if k not in rec:
                raise ValueError(f"{path}:{i}: labelled window lacks {k!r}")
        out.append(rec)
    return out


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class EvalResult:
    model: str
    variant: str
    backend: str
    n: int = 0
    correct: int = 0
    fallbacks: int = 0
    latencies: list[float] = field(default_factory=list)
    predictions: list[dict] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def majority(self) -> tuple[str, float]:
        """The constant answer's accuracy: ("keep" | "replace", share of windows with that label)."""
        if not self.n:
            return "keep", 0.0
        rep = sum(bool(p["label"]) for p in self.predictions)
        return ("replace", rep / self.n) if 2 * rep > self.n else ("keep", (self.n - rep) / self.n)

    def by(self, key: str) -> dict[str, tuple[int, int]]:
        """{value of `key` (split, kind): (right, n)} over the predictions."""
        out: dict[str, list[int]] = {}
        for p in self.predictions:
            c = out.setdefault(str(p.get(key)), [0, 0])
            c[0] += bool(p["ok"])
            c[1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(out.items())}

    def summary(self) -> dict[str, Any]:
        p50, p95 = percentile(self.latencies, 0.5), percentile(self.latencies, 0.95)
        return {"model": self.model, "variant": self.variant, "backend": self.backend, "n": self.n,
                "accuracy": round(self.accuracy, 3),
                "majority": round(self.majority[1], 3), "majority_answer": self.majority[0],
                "replace_share": round(sum(bool(p["replace"]) for p in self.predictions) / self.n, 3)
                if self.n else None,
                "fallbacks": self.fallbacks,
                "latency_p50_s": None if p50 is None else round(p50, 3),
                "latency_p95_s": None if p95 is None else round(p95, 3)}


def wait_while(pause_file: str | Path | None, poll_s: float = 5.0) -> float:
    """Sleeps while `pause_file` exists (a shared host: someone is timing a benchmark); returns
    the seconds waited."""
    if not pause_file:
        return 0.0
    t0 = time.monotonic()
    while Path(pause_file).exists():
        time.sleep(poll_s)
    return time.monotonic() - t0


def evaluate(maker: DecisionMaker, windows: list[dict], variant: str, history_k: int = 4,
             pause_file: str | Path | None = None,
             progress: Callable[[EvalResult, int], None] | None = None) -> EvalResult:
    """pause_file: before each window, wait while this file exists (the wait is not latency).
    progress(result so far, windows in all): called after each window."""
    res = EvalResult(maker.model, variant, maker.backend.name)
    for rec in windows:
        wait_while(pause_file)
        builder = ContextBuilder(rec["context"], variant, history_k)
        prompt = builder.build(rec["window"], rec.get("history") or [], rec.get("recent") or [])
        d = maker.decide(prompt)
        ok = bool(agrees(d.replace, bool(rec["label_replace"]), d.fallback))
        res.n += 1
        res.correct += ok
        res.fallbacks += d.fallback is not None
        if d.latency_s is not None:
            res.latencies.append(d.latency_s)
        res.predictions.append({"source": rec.get("source"), "kind": rec.get("kind"),
                                "split": rec.get("split", "tune"),
                                "label": rec["label_replace"], "replace": d.replace, "fallback": d.fallback,
                                "ok": ok, "latency_s": d.latency_s, "raw": d.raw})
        if progress is not None:
            progress(res, len(windows))
    return res


def make_backend(model: str, url: str | None = None, threads: int = 1, model_path: str | None = None) -> Backend:
    if url:
        return HttpBackend(url, model=model)
    from rudder.agent.models import resolve

    return InprocBackend(resolve(model, model_path), threads=threads)


def evaluate_many(path: str | Path | list, models: Iterable[str], variants: Iterable[str], url: str | None = None,
                  threads: int = 1, timeout_s: float = 60.0, max_tokens: int = 160, limit: int | None = None,
                  model_path: str | None = None, pause_file: str | Path | None = None,
                  progress: Callable[[EvalResult, int], None] | None = None) -> list[EvalResult]:
    """Every model x variant on the file; each model is loaded once."""
    windows = load_windows(path)[:limit]
    if not windows:  # an n=0 table would read as a result
        names = path if isinstance(path, (list, tuple)) else [path]
        raise ValueError(f"no labelled windows in {', '.join(map(str, names))}")
    results = []
    for model in models:
        backend = make_backend(model, url, threads, model_path)
        maker = DecisionMaker(backend, model, "static", max_tokens=max_tokens, timeout_s=timeout_s)
        try:
            for v in variants:
                wait_while(pause_file)
                # the constant prefix, cached as in a run (not timed); a server named by url
                # must answer (a table of fallbacks would read as a result)
                maker.warm(warm_prompt(v), strict=url is not None)
                t0 = time.monotonic()
                r = evaluate(maker, windows, v, pause_file=pause_file, progress=progress)
                log.info("%s / %s: accuracy %.2f on %d windows (%.1f s)", model, v, r.accuracy, r.n,
                         time.monotonic() - t0)
                results.append(r)
        finally:
            maker.close()
    return results


# ---- the starter set -------------------------------------------------------------------------
def _ctx(rng: random.Random) -> dict:
    halo = rng.choice([20000, 60000, 150000])
    frac = rng.choice([0.25, 0.5])
    parts = rng.choice([2, 4, 8])
    nodes = halo * rng.choice([4, 8]) * parts // 2
    return {"rank": 0, "num_trainers": parts, "part_id": 0, "num_parts": parts, "num_nodes": nodes,
            "partition_nodes": nodes // parts, "halo_nodes": halo, "capacity": int(halo * frac),
            "batch_size": rng.choice([1000, 2000]), "fanouts": [10, 25], "steps_per_epoch": 100,
            "epochs": 3, "feat_dim": 100, "feat_bytes": 400, "window": 10, "lookahead": 3}


def _window(rng: random.Random, ctx: dict, wid: int, hr: float, stale: float, missing: float) -> dict:
    cap = ctx["capacity"]
    remote = ctx["batch_size"] * rng.randint(8, 20) * 10  # 10 minibatches
    return {"window": wid, "first_step": wid * 10, "last_step": wid * 10 + 9, "minibatches": 10,
            "hit_rate": round(hr, 3), "remote_rows": remote, "fetched_rows": int(remote * (1 - hr)),
            "replaced_rows": 0, "t_fetch": 0.5, "t_stall": 0.0, "t_minibatch": 0.2, "buffer_fill": cap,
            "stale_slots": int(stale * cap), "lookahead_missing": int(missing * cap),
            "lookahead_rows": int(min(missing, 0.15) * cap),
            "missed_nodes": 0, "missed_again": 0, "missed_union": 0}  # no missed sets recorded


def make_starter_windows(n_each: int = 12, seed: int = 0) -> list[dict]:
    """Unambiguous synthetic cases, half replace, half keep, shuffled.
    replace: hit rate low (12-35%) and falling 4-12 pt, 45-85% of slots stale, the next
             minibatches lack 40-150% of capacity.
    keep:    hit rate high (55-85%) and rising or steady, <10% stale, <5% of capacity missing."""
    rng = random.Random(seed)
    out = []
    for i in range(n_each):
        ctx = _ctx(rng)
        wid = rng.randint(3, 25)
        hr = rng.uniform(0.12, 0.35)
        drops = [rng.uniform(0.02, 0.06) for _ in range(2)]
        recent = [round(hr + drops[0] + drops[1], 3), round(hr + drops[1], 3)]
        w = _window(rng, ctx, wid, hr, rng.uniform(0.45, 0.85), rng.uniform(0.4, 1.5))
        out.append({"context": ctx, "window": w, "recent": recent, "history": [], "label_replace": True,
                    "kind": "falling-stale-missing", "source": f"starter:{seed}:r{i}"})
    for i in range(n_each):
        ctx = _ctx(rng)
        wid = rng.randint(3, 25)
        hr = rng.uniform(0.55, 0.85)
        rises = [rng.uniform(-0.005, 0.04) for _ in range(2)]
        recent = [round(hr - rises[0] - rises[1], 3), round(hr - rises[1], 3)]
        w = _window(rng, ctx, wid, hr, rng.uniform(0.0, 0.1), rng.uniform(0.0, 0.05))
        out.append({"context": ctx, "window": w, "recent": recent, "history": [], "label_replace": False,
                    "kind": "high-fresh-covered", "source": f"starter:{seed}:k{i}"})
    rng.shuffle(out)
    return out


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ---- labelling windows of real runs -----------------------------------------------------------
HORIZON = 2  # windows after a replacement over which its gain is counted


def _run_context(run_dir: Path, rank: int) -> dict:
    """The trainer's RunContext as saved in run.json (`contexts: {rank: {...}}` or `context`)."""
    data = read_run(run_dir, missing_ok=True)
    if not data:
        return {}
    ctxs = data.get("contexts") or {}
    ctx = ctxs.get(str(rank)) or ctxs.get(rank) or data.get("context") or {}
    if not ctx and (data.get("sim") or {}).get("source"):  # a replay: rebuilt from its trace
        from rudder.agent.hindsight import sim_context

        try:
            ctx = sim_context(run_dir, rank)
        except (OSError, ValueError) as exc:
            log.warning("%s: no context for rank %d (%s)", run_dir, rank, exc)
    return ctx


def _net_gain(judged: dict, after: list[dict]) -> float:
    """Hits gained over the following windows (vs the judged window's hit rate), net of the rows
    admitted by replacements in those windows."""
    base = float(judged.get("hit_rate") or 0.0)
    gain = sum((float(a.get("hit_rate") or 0.0) - base) * float(a.get("remote_rows") or 0) for a in after)
    cost = sum(float(a.get("replaced_rows") or 0) for a in after)
    return gain - cost


def _history_entry(rec: dict, windows: list[dict], by_id: dict[int, int], capacity: int = 0) -> dict:
    """A past decision record as the agent's history shows it: its measured deltas and the
    window it judged (with the hit rate before it), so hindsight examples can be built."""
    h = HistoryEntry.model_validate(rec)
    h.hit_delta, h.rows_delta = rec.get("outcome_hit_delta"), rec.get("outcome_rows_delta")
    if h.budget and capacity and h.rows is None:
        h.rows = budget_rows(h.budget, capacity)
    i = by_id.get(rec.get("window"))
    if i is not None:
        judged = dict(windows[i])
        if i > 0 and windows[i - 1].get("hit_rate") is not None:
            judged["prev_hit_rate"] = windows[i - 1]["hit_rate"]
        h.judged = judged
    return h.model_dump(exclude_none=True)


def label_windows_from_run(run_dir: str | Path, horizon: int = HORIZON, by: str = "outcome",
                           scenario: str | None = None) -> list[dict]:
    """Labels the windows of a finished run at which a replacement was (or was not) made.

    by="counterfactual": every judged decision labels its window by what replacing there saved
    against keeping, both replayed from the same buffer state (`rudder agent judge` wrote it:
    cf_replace_share; rudder.agent.judge.hindsight_label), whichever action the run took; too
    close to call and unjudged windows are left out. `scenario` is recorded on each window (for
    held-out splits by scenario: split_held_out).

    The rule, per trainer rank R (windows-rR.jsonl, decisions-rR.jsonl):
    - a window judged by a decision that replaced (replace=True, no fallback, applied) is labelled
      replace=True when the replacement paid: over the `horizon` windows that close after the
      applied step, sum((hit_rate_after - hit_rate_judged) x remote_rows_after) - replaced_rows_after
      > 0, i.e. it raised the following windows' hits by more rows than it cost; else False;
    - a window judged by a decision that kept the buffer is labelled replace=False when the next
      window's hit rate did not fall by more than 1 pt (keeping was fine); when it fell the window
      is left unlabelled (nothing tells whether a replacement would have helped);
    - a run without decision records (e.g. the fixed schedule) is read the same way: a window
      followed by a window with replaced_rows > 0 counts as a replacement judged on it.
    Fallback and never-applied decisions are skipped. Each record carries the decisions before it
    as history, the 3 earlier windows as `recent`, and `net_rows` (the gain, for replacements).
    """
    if by not in LABEL_BY:
        raise ValueError(f"unknown labelling {by!r}; valid: {', '.join(LABEL_BY)}")
    read_run(run_dir)  # a typo'd or non-run path is an error naming it, not 0 windows
    if by == "counterfactual":
        return _label_counterfactual(Path(run_dir), scenario)
    run_dir = Path(run_dir)
    from rudder.records import read_jsonl

    out: list[dict] = []
    for wpath in sorted(run_dir.glob("windows-r*.jsonl")):
        rank = int(wpath.stem.split("-r")[-1])
        windows = sorted(read_jsonl(wpath), key=lambda w: w["window"])
        if not windows:
            continue
        by_id = {w["window"]: i for i, w in enumerate(windows)}
        ctx = _run_context(run_dir, rank)
        decisions = sorted(read_jsonl(run_dir / f"decisions-r{rank}.jsonl"), key=lambda d: d["decision"])
        events: list[tuple[dict, int, bool]] = []  # (decision record or {}, judged index, replaced)
        if decisions:
            for d in decisions:
                if d.get("fallback") or d.get("applied_step") is None or d.get("window") not in by_id:
                    continue
                events.append((d, by_id[d["window"]], bool(d.get("replace"))))
        else:
            for i in range(len(windows) - 1):
                events.append(({"applied_step": windows[i + 1]["first_step"]}, i,
                               (windows[i + 1].get("replaced_rows") or 0) > 0))
        for d, i, replaced in events:
            judged = windows[i]
            after = [w for w in windows[i + 1:] if w["last_step"] >= d["applied_step"]][:horizon]
            if not after:
                continue
            if replaced:
                net = _net_gain(judged, after)
                label: bool | None = net > 0
            else:
                net = None
                fell = direction(float(after[0].get("hit_rate") or 0) - float(judged.get("hit_rate") or 0),
                                 HIT_TOL) == "down"
                label = None if fell else False
            if label is None:
                continue
            history = [_history_entry(p, windows, by_id, int(ctx.get("capacity") or 0))
                       for p in decisions if p["decision"] < d.get("decision", 0) and p.get("applied_step") is not None]
            out.append({"context": ctx, "window": judged, "recent": windows[max(0, i - 3):i],
                        "history": history[-4:], "label_replace": label, "net_rows": net,
                        "kind": "run", "rank": rank,
                        "source": f"{run_dir.name}:r{rank}:w{judged['window']}"})
    return out


LABEL_BY = ("outcome", "counterfactual")


def _label_counterfactual(run_dir: Path, scenario: str | None) -> list[dict]:
    from rudder.agent.judge import hindsight_label
    from rudder.records import read_jsonl

    out: list[dict] = []
    for wpath in sorted(run_dir.glob("windows-r*.jsonl")):
        rank = int(wpath.stem.split("-r")[-1])
        windows = sorted(read_jsonl(wpath), key=lambda w: w["window"])
        by_id = {w["window"]: i for i, w in enumerate(windows)}
        ctx = _run_context(run_dir, rank)
        dpath = run_dir / f"decisions-r{rank}.jsonl"
        decisions = sorted(read_jsonl(dpath), key=lambda d: d["decision"]) if dpath.exists() else []
        for d in decisions:
            share = d.get("cf_replace_share")
            label = None if share is None else hindsight_label({"share": share})
            if label is None or d.get("window") not in by_id:
                continue
            i = by_id[d["window"]]
            history = [_history_entry(p, windows, by_id, int(ctx.get("capacity") or 0))
                       for p in decisions if p["decision"] < d["decision"] and p.get("applied_step") is not None]
            out.append({"context": ctx, "window": windows[i], "recent": windows[max(0, i - 3):i],
                        "history": history[-4:], "label_replace": label, "label_by": "counterfactual",
                        "cf_replace_share": share, "cf_rows_saved": d.get("cf_rows_saved"),
                        "scenario": scenario, "kind": "counterfactual", "rank": rank,
                        "source": f"{run_dir.name}:r{rank}:w{windows[i]['window']}"})
    return out


def label_balance(records: list[dict], key: str = "scenario") -> dict[str, dict]:
    """Per value of `key` (and "all"): windows, replace-right, keep-right, replace share."""
    groups: dict[str, list[dict]] = {"all": records}
    for r in records:
        groups.setdefault(str(r.get(key)), []).append(r)
    out = {}
    for k, rs in groups.items():
        rep = sum(bool(r["label_replace"]) for r in rs)
        out[k] = {"n": len(rs), "replace": rep, "keep": len(rs) - rep,
                  "replace_share": rep / len(rs) if rs else 0.0}
    return out


def balanced(records: list[dict], key: str = "scenario", seed: int = 0) -> list[dict]:
    """Per value of `key`, the majority label downsampled to the minority's count (a group with
    one label only is dropped: it teaches no choice). Order kept."""
    rng = random.Random(seed)
    keep: set[int] = set()
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(str(r.get(key)), []).append(i)
    for idx in groups.values():
        pos = [i for i in idx if records[i]["label_replace"]]
        neg = [i for i in idx if not records[i]["label_replace"]]
        n = min(len(pos), len(neg))
        keep.update(rng.sample(pos, n) + rng.sample(neg, n))
    return [r for i, r in enumerate(records) if i in keep]


def split_held_out(records: list[dict], held_out: Iterable[str], key: str = "scenario") -> tuple[list[dict], list[dict]]:
    """(train, test): the windows whose `key` (scenario, or e.g. context.dataset via a
    dotted key) is in `held_out` go to test. Raises when a held-out value names no window."""
    held = set(held_out)

    def val(r: dict) -> str:
        v: Any = r
        for part in key.split("."):
            v = (v or {}).get(part) if isinstance(v, dict) else None
        return str(v)

    seen = {val(r) for r in records}
    missing = held - seen
    if missing:
        raise ValueError(f"held-out {key} {sorted(missing)} not among the windows' {sorted(seen)}")
    test = [r for r in records if val(r) in held]
    return [r for r in records if val(r) not in held], test


def format_table(rows: list[dict]) -> str:
    cols = ["model", "variant", "backend", "n", "accuracy", "majority", "majority_answer",
            "replace_share", "fallbacks",
            "latency_p50_s", "latency_p95_s"]
    widths = {c: max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols} if rows else {}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    for r in rows:
        lines.append("  ".join(str(r.get(c)).ljust(widths[c]) for c in cols))
    return "\n".join(lines)


if __name__ == "__main__":  # regenerates the starter set
    print(write_jsonl(make_starter_windows(), STARTER))
