"""Issue 18, must-have 5: does the default model's replace/keep preference read the window once the
examples' bias is taken out? Contextual calibration (Zhao et al. 2021, "Calibrate before use"),
measured on the held-out decision suite.

  python benchmarks/bench_calibration_probe.py --windows benchmarks/results/cf_suite_past/heldout-synth-medium.jsonl
         [--model smollm2-135m] [--orders 0,1,2,3 1,0,3,2] [--formats decision-first reason-first] [--no-twin] --json OUT
  python benchmarks/bench_calibration_probe.py --resummarise OUT

For each labelled window: judge-history-2b's prompt (its four canned examples in each --orders
order, as bench_cf_suite_past's --canned-order), the answer forced to start `{"replace":`, and the
model's logit margin of `true` over `false` at the next token -- once for the window and once for
its content-free twin (every number of the question replaced by "n/a"). decision-first: the
examples and the system's answer format put "replace" first (the reason last), so the margin is
read where the examples' answers decide; reason-first: the prompt as shipped (the model would write
its reason first; the forced key skips it). Per order and format: the accuracy of the raw margin
(> 0: replace), calibrated per window (margin - its twin's), calibrated by the mean twin margin
(one offset, as in the paper), the best single threshold in hindsight (an upper bound on any
one-offset calibration), and the margin's AUC against the labels. Batch calibration (Zhou et al.
2023) needs no twin: the offset is the mean margin over the windows themselves -- of the whole
batch, or online, of the windows before each one (what a live agent could do). With two or more
orders, the order ensemble averages each window's margin over them (the position bias of one order
cancels another's) and is summarised the same way. --no-twin skips the content-free reads (half
the time; the twin-calibrated figures are then nan). --resummarise FILE recomputes a results file's
summaries (and its ensemble) from its recorded margins, with no model. In process, 1 thread; the
prompt's hash changes with the order and format (an experiment, not a shipped prompt).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

nan = float("nan")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

NUMBER = re.compile(r"-?\d[\d,]*(\.\d+)?%?")
DECISION_FIRST_ANSWER = (
    '{"replace": true|false, "budget": "small"|"medium"|"large", "evict": "stale"|"half", '
    '"expected": {"hit_rate": "up"|"down"|"flat", "remote_rows": "up"|"down"|"flat"}, '
    '"reason": "<the signals you weigh>"}')


def auc(margins: np.ndarray, labels: np.ndarray) -> float:
    """P(a replace window's margin > a keep window's), ties half; nan with one label only."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, margins)) if len(set(labels.tolist())) == 2 else nan


def online_offsets(m: np.ndarray) -> np.ndarray:
    """Each window's offset: the mean margin of the windows before it (0 for the first)."""
    return np.r_[0.0, np.cumsum(m)[:-1]] / np.maximum(np.arange(len(m)), 1)


def online_accuracy(m: np.ndarray, labels: np.ndarray, shuffles: int = 200) -> float:
    """Online batch calibration's accuracy, averaged over seeded shuffles of the windows: the file's
    order groups a run's windows, whose labels run together, and a running mean would read that."""
    rng = np.random.default_rng(0)
    accs = []
    for _ in range(shuffles):
        perm = rng.permutation(len(m))
        accs.append((((m[perm] - online_offsets(m[perm])) > 0) == labels[perm]).mean())
    return float(np.mean(accs))


def summarise(m: np.ndarray, m_cf: np.ndarray | None, labels: np.ndarray) -> dict:
    """The accuracies and AUCs of one order's margins; the twin-calibrated ones nan without twins."""
    cuts = np.r_[m - 1e-6, m + 1e-6]
    twin = {"accuracy_calibrated_per_window": nan, "accuracy_calibrated_mean": nan, "auc_calibrated": nan}
    if m_cf is not None:
        twin = {"accuracy_calibrated_per_window": float((((m - m_cf) > 0) == labels).mean()),
                "accuracy_calibrated_mean": float((((m - m_cf.mean()) > 0) == labels).mean()),
                "auc_calibrated": auc(m - m_cf, labels)}
    return {"n": int(len(m)), "replace_share_raw": float((m > 0).mean()),
            "accuracy_raw": float(((m > 0) == labels).mean()),
            "accuracy_calibrated_per_window": twin["accuracy_calibrated_per_window"],
            "accuracy_calibrated_mean": twin["accuracy_calibrated_mean"],
            "accuracy_batch_calibrated": float((((m - m.mean()) > 0) == labels).mean()),
            "accuracy_batch_online": online_accuracy(m, labels),
            "accuracy_best_threshold": float(max(((m > t) == labels).mean() for t in cuts)),
            "auc": auc(m, labels), "auc_calibrated": twin["auc_calibrated"]}


def summarise_runs(runs: dict[str, dict]) -> dict[str, dict]:
    """Each order's summary from its recorded margins, and with two or more orders their ensemble
    (each window's margin averaged over the orders)."""
    out = {}
    for key, run in runs.items():
        rows = run["rows"]
        twins = [r.get("margin_content_free") for r in rows]
        m_cf = None if any(t is None for t in twins) else np.array(twins)
        summary = summarise(np.array([r["margin"] for r in rows]), m_cf, np.array([r["label"] for r in rows]))
        out[key] = {**run, **summary}
    if len(runs) >= 2:
        sources = [[r["source"] for r in run["rows"]] for run in runs.values()]
        if any(s != sources[0] for s in sources):
            raise SystemExit("the orders read different windows: no ensemble")
        mean = np.mean([[r["margin"] for r in run["rows"]] for run in runs.values()], axis=0)
        labels = np.array([r["label"] for r in next(iter(runs.values()))["rows"]])
        out["ensemble"] = {"of": list(runs), **summarise(mean, None, labels)}
    return out


class Probe:
    """The model's logit margin of `true` over `false` after `{"replace":`."""

    def __init__(self, model: str, threads: int = 1):
        from rudder.agent.choice import ChoiceDecoder
        from rudder.agent.decision import InprocBackend
        from rudder.agent.models import resolve

        self.backend = InprocBackend(resolve(model), threads=threads)  # the margins do not depend on it
        self.llm = self.backend.llm
        self.decoder = ChoiceDecoder(self.llm)
        yes = self.llm.tokenize(b'{"replace": true', add_bos=False, special=False)
        no = self.llm.tokenize(b'{"replace": false', add_bos=False, special=False)
        k = next(i for i in range(min(len(yes), len(no))) if yes[i] != no[i])
        self.prefix, self.yes, self.no = yes[:k], yes[k], no[k]

    def margin(self, messages: list[dict]) -> float:
        self.decoder.read(self.decoder.prompt_tokens(messages) + self.prefix)
        logits = self.decoder.logits()
        return float(logits[self.yes] - logits[self.no])


def probe_order(probe: Probe, windows: list[dict], order: list[int], decision_first: bool,
                twin: bool = True) -> list[dict]:
    from bench_cf_suite_past import reorder_canned

    from rudder.agent import context, prompt_texts
    from rudder.agent.history_examples import PAST_CANNED

    shipped_examples, shipped_variant = list(PAST_CANNED), context.VARIANTS["judge-history-2b"]
    try:
        reorder_canned(order)  # checks the order names distinct examples
        context.VARIANTS["judge-history-2b"] = dataclasses.replace(shipped_variant, reason_first=not decision_first)
        rows, t0 = [], time.time()
        for i, rec in enumerate(windows):
            if i and i % 10 == 0:
                print(f"  {i}/{len(windows)} windows, {(time.time() - t0) / i:.1f} s each", file=sys.stderr, flush=True)
            prompt = context.ContextBuilder(rec["context"], "judge-history-2b", 4).build(
                rec["window"], [], rec.get("recent") or [])
            msgs = [dict(m) for m in prompt.messages]
            if decision_first:
                assert prompt_texts.JUDGE_HISTORY_ANSWER in msgs[0]["content"]
                msgs[0]["content"] = msgs[0]["content"].replace(prompt_texts.JUDGE_HISTORY_ANSWER, DECISION_FIRST_ANSWER)
            masked = [*msgs[:-1], {**msgs[-1], "content": NUMBER.sub("n/a", msgs[-1]["content"])}]
            rows.append({"source": rec["source"], "label": bool(rec["label_replace"]),
                         "margin": probe.margin(msgs), "margin_content_free": probe.margin(masked) if twin else None})
        return rows
    finally:
        PAST_CANNED[:] = shipped_examples
        context.VARIANTS["judge-history-2b"] = shipped_variant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", help="labelled windows (bench_cf_suite_past's heldout-G.jsonl)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--orders", nargs="+", default=["0,1,2,3", "1,0,3,2"],
                    help="judge-history-2b's canned examples in these orders (0 keep, 1 replace, 2 keep, 3 replace)")
    ap.add_argument("--formats", nargs="+", choices=["decision-first", "reason-first"], default=["decision-first"])
    ap.add_argument("--no-twin", action="store_true", help="skip the content-free twins (half the model time)")
    ap.add_argument("--json", help="results, rewritten after each order x format")
    ap.add_argument("--resummarise", metavar="JSON", help="recompute a results file's summaries from its margins")
    args = ap.parse_args()
    if args.resummarise:
        data = json.loads(Path(args.resummarise).read_text())
        runs = {k: v for k, v in data.items() if isinstance(v, dict) and "rows" in v}
        data.update(summarise_runs(runs))
        Path(args.resummarise).write_text(json.dumps(data, indent=1))
        report(data)
        return
    if not (args.windows and args.json):
        ap.error("--windows and --json are needed to probe (or --resummarise JSON)")
    windows = [json.loads(x) for x in Path(args.windows).read_text().splitlines() if x.strip()]
    probe = Probe(args.model)
    runs: dict[str, dict] = {}
    for order in args.orders:
        idx = [int(i) for i in order.split(",")]
        for fmt in args.formats:
            t0 = time.time()
            rows = probe_order(probe, windows, idx, fmt == "decision-first", twin=not args.no_twin)
            runs[f"{order} {fmt}"] = {"seconds": time.time() - t0, "rows": rows}
            data = {"model": args.model, "windows": args.windows, **summarise_runs(runs)}
            Path(args.json).write_text(json.dumps(data, indent=1))
            print(f"order {order} {fmt}: {len(rows)} windows, {time.time() - t0:.0f} s", flush=True)
    report(data)


def report(data: dict) -> None:
    for key, s in data.items():
        if isinstance(s, dict) and "auc" in s:
            print(f"{key}: " + ", ".join(f"{k} {v:.2f}" for k, v in s.items()
                                         if isinstance(v, float) and k != "seconds"), flush=True)


if __name__ == "__main__":
    main()
