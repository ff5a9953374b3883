"""Issue 18 (h18f): the past counterfactual computed live -- what it costs the loader and whether
it equals the replay's on the run's own recorded trace.

  python benchmarks/bench_past_live.py RUN_DIR [RUN_DIR ...]

For each live run (a run dir of `rudder run` / bench_scenario_live.py whose windows carry the
past counterfactual: the agent with a past prompt variant, judge-history-2 / -2b):
  cost     t_past_cf per window (the index copy at its start + the branch replays at its
           close): median / max ms, and their sum over the run's epochs' time; t_past_loader:
           the loader thread's share of it (all of it on the loader; the index copy alone with
           prefetch.past_thread, the replays on a thread of their own), median ms and its sum
           over the epochs' time (an upper bound of what it adds: the loader overlaps the
           training thread)
  replay   the run's trace replayed with its recorded actions (rudder.agent.hindsight.
           RecordedActions: each applied decision at its step, the fallback where it steered;
           the replay checks every minibatch's hits against the run's) by a policy that asks
           for the same past rounds: windows whose past_* fields equal the live ones exactly
           (and the replay's own t_past_cf, one process, for comparison)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.records import read_jsonl, read_run  # noqa: E402


def past_cost(run_dir: Path, ranks: int) -> dict:
    """{windows, past_windows, t_past_cf_ms_median, t_past_cf_ms_max, past_share,
    t_past_loader_ms_median, loader_share}: the live counterfactual's seconds from the window
    records (the shares: their sum / the epochs' sum, over all ranks)."""
    wins = [w for r in range(ranks) for w in read_jsonl(run_dir / f"windows-r{r}.jsonl")]
    eps = [e for r in range(ranks) for e in read_jsonl(run_dir / f"epochs-r{r}.jsonl")]
    t = [w["t_past_cf"] for w in wins if w.get("t_past_cf") is not None]
    out = {"windows": len(wins), "past_windows": len(t)}
    if t:
        epochs = max(sum(e["t_epoch"] for e in eps), 1e-9)
        out.update(t_past_cf_ms_median=1e3 * statistics.median(t), t_past_cf_ms_max=1e3 * max(t),
                   past_share=sum(t) / epochs)
        lt = [w["t_past_loader"] for w in wins if w.get("t_past_loader") is not None]
        if lt:  # runs before prefetch.past_thread have none: all of it was the loader's
            out.update(t_past_loader_ms_median=1e3 * statistics.median(lt), loader_share=sum(lt) / epochs)
    return out


def replay_check(run_dir: Path, rank: int) -> dict:
    """The run's windows against a replay of its trace with its recorded actions, asking for the
    same past rounds: {windows, equal, max_rel_diff, first_diff}."""
    from rudder.agent import hindsight
    from rudder.agent.steering import past_rounds
    from rudder.config import PrefetchConfig
    from rudder.sim.replay import BufferReplayer, replay

    f = hindsight._Forks(run_dir, rank, horizon=1)  # the run's replay, as the judge builds it
    pc = PrefetchConfig.model_validate({k: v for k, v in read_run(run_dir)["config"]["prefetch"].items()
                                        if k in PrefetchConfig.model_fields})
    rounds = past_rounds(f.C, pc)
    actions = f.run.policy
    actions.past_rounds = lambda: rounds  # the same rounds the live agent asked for
    rp = BufferReplayer(f.pt, actions, f.C, alpha=pc.alpha, period=pc.period, depth=f.run.depth,
                        window=f.W)
    rp.fill(f.pt.trace.init_positions()[:f.C])
    replay(f.pt, rp, after_step=lambda g, c: _check(g, c, f.recorded))
    live = read_jsonl(run_dir / f"windows-r{rank}.jsonl")
    keys = ["past_minibatches", "past_keep_fetched", *(f"past_fetched_{k}" for k in rounds)]
    equal, worst, first = 0, 0.0, None
    for lw, rw in zip(live, rp.windows):
        if all(lw.get(k) == rw.get(k) for k in keys):
            equal += 1
            continue
        first = first if first is not None else {"window": lw["window"], "live": {k: lw.get(k) for k in keys},
                                                 "replay": {k: rw.get(k) for k in keys}}
        worst = max([worst] + [abs(lw[k] - rw[k]) / max(rw[k], 1) for k in keys[1:] if lw.get(k) is not None])
    t = [w["t_past_cf"] for w in rp.windows if "t_past_cf" in w]
    return {"windows": min(len(live), len(rp.windows)), "equal": equal, "max_rel_diff": worst,
            "first_diff": first, "replay_t_past_cf_ms_median": 1e3 * statistics.median(t) if t else None}


def _check(g: int, c, recorded: list[int]) -> None:
    if g < len(recorded) and c.hits != recorded[g]:
        raise RuntimeError(f"the replay diverged from the run at minibatch {g}: {c.hits} hits, run {recorded[g]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the replay (1: as a trainer on this host, OMP_NUM_THREADS)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for rd in map(Path, args.runs):
        meta = read_run(rd)
        c = meta["config"]["cluster"]
        ranks = c["machines"] * c["trainers_per_machine"]
        row = {"run_dir": str(rd), **past_cost(rd, ranks)}
        if row["past_windows"]:
            row["replay"] = {r: replay_check(rd, r) for r in range(ranks)}
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
