"""Issue 18: what the past counterfactual costs a window close, by replay -- the seconds the
live loader (or its worker thread) spends on it, without a cluster -- and a digest of the fields
it measures, so that two checkouts (before / after a change) can be compared on the same traces:
the digests must be equal, the times are the change's worth.

  python benchmarks/bench_past_cost.py TRACE.npz [TRACE.npz ...] [--past-windows 4 1]
         [--rounds none periodic] [--repeats 3] [--json OUT]

For each trace x past_windows x rounds: the trace replayed (rudder.sim.replay.BufferReplayer, one
torch thread, as a trainer on this host) by a policy that asks, at every window, for the past
counterfactual of the scenario's MassiveGNN rounds (rudder.agent.steering.past_rounds: every
budget x evict word) over `past_windows` windows. `rounds`: `none` runs no round of its own;
`periodic` runs a round of 1/7 of the capacity every 10 minibatches (from minibatch 3), so the
windows start from buffers a round changed. Reported: the
median and total t_past_cf over the repeats' windows, and the sha256 of every window's past_*
fields (equal across repeats, else the benchmark fails: the measurement is deterministic).
The scenario settings are history_cold_bench's (alpha 0.05, period 10, window 5).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.prefetch.policy import Replace, ScriptedRounds  # noqa: E402

SETTINGS = {"lookahead": 0, "init": "random", "alpha": 0.05, "period": 10, "window": 5}


def periodic_rounds(minibatches: int, capacity: int) -> dict[int, Replace]:
    """A MassiveGNN round of 1/7 of the capacity at minibatch 3 and every 10th after it."""
    return {g: Replace("massivegnn", capacity // 7, "t") for g in range(3, minibatches, 10)}


def replay_windows(trace, past_windows: int, rounds: str) -> list[dict]:
    """The window records of one replay of `trace`, each with its past counterfactual."""
    from rudder.agent.steering import past_rounds
    from rudder.config import PrefetchConfig
    from rudder.sim.replay import BufferReplayer, PositionTrace, replay

    pc = PrefetchConfig.model_validate({**SETTINGS, "past_windows": past_windows})
    pt = PositionTrace(trace)
    C = trace.capacity
    at = periodic_rounds(len(pt), C) if rounds == "periodic" else {}
    pol = ScriptedRounds(at, past_rounds(C, pc), past_windows)
    rp = BufferReplayer(pt, pol, C, alpha=pc.alpha, period=pc.period, depth=0, window=pc.window)
    rp.fill(trace.init_positions()[:C])
    replay(pt, rp)
    return pol.windows


def measure(trace, past_windows: int, rounds: str) -> tuple[list[float], str]:
    """(t_past_cf of every window, sha256 of the windows' past_* fields) of one replay."""
    wins = replay_windows(trace, past_windows, rounds)
    fields = [{k: v for k, v in w.items() if k.startswith("past_")} for w in wins]
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return [w["t_past_cf"] for w in wins if "t_past_cf" in w], digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="trace files (rudder tracegen / a run's trace-r<R>.npz)")
    ap.add_argument("--past-windows", type=int, nargs="+", default=[4, 1])
    ap.add_argument("--rounds", nargs="+", default=["none", "periodic"], choices=["none", "periodic"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    import torch

    from rudder.trace import Trace

    torch.set_num_threads(1)
    rows = []
    for path in args.traces:
        trace = Trace.load(path)
        for pw in args.past_windows:
            for rounds in args.rounds:
                times, digests = [], set()
                for _ in range(args.repeats):
                    t, d = measure(trace, pw, rounds)
                    times += t
                    digests.add(d)
                if len(digests) != 1:
                    sys.exit(f"{path}: the past counterfactual differs between repeats ({pw} windows, rounds {rounds})")
                row = {"trace": path, "past_windows": pw, "rounds": rounds, "windows": len(times) // args.repeats,
                       "t_past_cf_ms_median": round(1e3 * statistics.median(times), 2) if times else None,
                       "t_past_cf_s_total": round(sum(times) / args.repeats, 3), "fields_sha256": digests.pop()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
