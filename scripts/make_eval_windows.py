"""Builds rudder/agent/eval_windows_runs.jsonl: labelled windows from replayed runs.

For each trace (made by `rudder tracegen`), two replays under the agent policy with a seeded
random decision maker (rudder.agent.hindsight.collect_run), written as run directories:
  lookahead on  (the config's depth and admission): replace = a lookahead round every minibatch
  lookahead off (lookahead 0): replace = one MassiveGNN round
Each run is labelled with `rudder agent label`'s rule (label_windows_from_run), each label checked
against the counterfactual (check_labels), and only confirmed windows are kept. The curated set
is balanced (replace / keep) per trace, and each entry names its source run and window.
`split` says tune (p2 traces) or held-out (p4 traces): prompts are tuned on the first only.

  python scripts/make_eval_windows.py TRACEGEN_DIR... --runs-dir /tmp/rudder-evalwin/runs \
      --per-trace 6 --out rudder/agent/eval_windows_runs.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from rudder.agent.eval import label_windows_from_run, write_jsonl
from rudder.agent.hindsight import check_labels, collect_run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="tracegen folders (their name names the runs)")
    ap.add_argument("--runs-dir", default="/tmp/rudder-evalwin/runs")
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--per-trace", type=int, default=6, help="windows per label per trace (at most)")
    ap.add_argument("--out", default="rudder/agent/eval_windows_runs.jsonl")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    out: list[dict] = []
    stats: Counter = Counter()
    for tpath in args.traces:
        tpath = Path(tpath)
        tname = tpath.name if tpath.is_dir() else tpath.parent.name
        pool: dict[bool, list[dict]] = {True: [], False: []}
        for la in (None, 0):
            for seed in map(int, args.seeds.split(",")):
                run = collect_run(tpath, args.runs_dir, window=args.window, lookahead=la, seed=seed)
                recs = check_labels(label_windows_from_run(run), run)
                mode = "lookahead" if la is None else "massivegnn"
                for r in recs:
                    stats[(mode, "labelled")] += 1
                    stats[(mode, {True: "agree", False: "disagree", None: "close"}[r["agrees"]])] += 1
                    if r["agrees"]:
                        r["kind"] = f"run:{mode}"
                        r["trace"] = tname
                        r["split"] = "held-out" if "-p4" in tname else "tune"
                        pool[bool(r["label_replace"])].append(r)
        n = min(args.per_trace, len(pool[True]), len(pool[False]))
        for label in (True, False):
            # one window per (run, window id) at most, spread over the run
            seen, pick = set(), []
            cands = pool[label][:]
            rng.shuffle(cands)
            for r in cands:
                key = (r["source"].split(":")[0], r["window"]["window"])
                if key in seen:
                    continue
                seen.add(key)
                pick.append(r)
                if len(pick) == n:
                    break
            out.extend(pick)
        print(f"{tname}: {len(pool[True])} replace / {len(pool[False])} keep confirmed; kept {n} + {n}",
              file=sys.stderr)
    for (mode, what), k in sorted(stats.items()):
        print(f"  {mode:10s} {what:9s} {k}", file=sys.stderr)
    rng.shuffle(out)
    write_jsonl(out, args.out)
    print(f"{len(out)} windows -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
