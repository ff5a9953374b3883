"""`rudder oracle RUN_DIR`: how far a run's buffer was from the hindsight optimum.

For every trace-r<R>.npz of the run, Belady's optimal replacement (demand fetch, bypass; see
rudder.sim.oracle) is computed for the run's capacity and initial fill, twice at the same
buffer memory (capacity rows): "Belady, halo only" (the 1-hop halo nodes, what the buffer can
hold today) and "Belady, all remote nodes" (every remote node the trainer pulled, 2+ hops
included: the unrestricted optimum, the yardstick). Both are set beside what the run measured
(minibatches-r<R>.jsonl: hits, remote_rows, fetched_rows). Written to oracle-r<R>.json in the
run directory ("belady": halo only, with the run's hits_fraction_of_optimal and
fetched_ratio_to_optimal; "belady_all_remote": all remote nodes, with hits_fraction_of_all_remote
and fetched_ratio_to_all_remote; each result's "name" says which it is).
"""
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "oracle",
        help="compare a run's buffer hits with Belady's optimum on its traces",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", type=Path, help="a run directory holding trace-r<R>.npz files")
    p.add_argument("--start", choices=["init", "empty"], default="init",
                   help="Belady starts from the run's initial fill (default) or an empty buffer")
    p.add_argument("--capacity", type=int, default=None, help="override the run's capacity (rows)")
    p.add_argument("--no-write", action="store_true", help="print only; write no oracle-r<R>.json")
    p.set_defaults(func=main)


def compare_run(run_dir: Path, start: str = "init", capacity: int | None = None,
                write: bool = True) -> list[dict]:
    """One comparison dict per rank (also written as oracle-r<R>.json unless write=False)."""
    from rudder.sim.oracle import belady
    from rudder.records import read_jsonl, write_json_atomic
    from rudder.trace import Trace, find_traces

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {run_dir}")
    traces = find_traces(run_dir)
    if not traces:
        raise FileNotFoundError(f"no trace-r<R>.npz in {run_dir} (was prefetch.record_trace off, "
                                "or the policy 'none', which has no buffer?)")
    out = []
    for rank, path in traces.items():
        trace = Trace.load(path)
        recs = read_jsonl(run_dir / f"minibatches-r{rank}.jsonl")
        recs = sorted(recs, key=lambda r: r.get("global_step", 0))
        n = trace.num_minibatches
        note = None
        if recs and len(recs) != n:
            note = f"run has {len(recs)} minibatch records, trace {n}: compared on the first " \
                   f"{min(len(recs), n)}"
            n = min(len(recs), n)
            trace, recs = trace.head(n), recs[:n]
        b = belady(trace, capacity, start)
        bs = b.summary()
        ba = belady(trace, capacity, start, universe="all").summary()
        run = None
        if recs:
            run = {k: int(sum(int(r.get(k) or 0) for r in recs))
                   for k in ("hits", "remote_rows", "fetched_rows", "replaced_rows")}
            run["minibatches"] = len(recs)
            run["hit_rate"] = run["hits"] / run["remote_rows"] if run["remote_rows"] else 0.0
            if run["remote_rows"] != bs["remote_rows"]:
                note = (note + "; " if note else "") + (
                    f"remote rows differ (run {run['remote_rows']}, trace {bs['remote_rows']})")
        res = {
            "rank": rank, "trace": str(path), "capacity": b.capacity, "start": start,
            "minibatches": n, "halo_nodes": bs["universe_nodes"],
            "remote_nodes": ba["universe_nodes"],  # distinct remote ids the trace holds (∪ halo)
            # the same memory as a share of each universe
            "capacity_fraction_of_halo": b.capacity / bs["universe_nodes"] if bs["universe_nodes"] else None,
            "capacity_fraction_of_remote_nodes": (b.capacity / ba["universe_nodes"]
                                                  if ba["universe_nodes"] else None),
            "belady": bs, "belady_all_remote": ba, "run": run,
            # share of the optimum's hits the run got (can exceed 1 only by pulling extra rows)
            "hits_fraction_of_optimal": _ratio(run, "hits", bs),
            # rows the run fetched per row the optimum fetched (>= 1: nothing fetches fewer)
            "fetched_ratio_to_optimal": _ratio(run, "fetched_rows", bs),
            # the same against the unrestricted optimum (the yardstick beyond the halo)
            "hits_fraction_of_all_remote": _ratio(run, "hits", ba),
            "fetched_ratio_to_all_remote": _ratio(run, "fetched_rows", ba),
            "note": note,
        }
        if write:
            write_json_atomic(run_dir / f"oracle-r{rank}.json", res)
        out.append(res)
    return out


def _ratio(run: dict | None, key: str, opt: dict) -> float | None:
    return run[key] / opt[key] if run and opt[key] else None


def format_table(rows: list[dict]) -> str:
    """Per rank, three lines at the run's buffer memory (capacity rows): the run, "Belady, all
    remote nodes" (the yardstick) and "Belady, halo only", with the run's hits and fetched rows
    as a share of each optimum's."""
    f3 = lambda x: f"{x:.3f}" if x is not None else "-"  # noqa: E731
    lines = []
    for r in rows:
        b, a, run = r["belady"], r["belady_all_remote"], r["run"]
        share = ", ".join(f"{f:.2f} of the {n:,} {what}" for f, n, what in (
            (r["capacity_fraction_of_halo"], r["halo_nodes"], "halo nodes"),
            (r["capacity_fraction_of_remote_nodes"], r["remote_nodes"], "remote nodes"))
            if f is not None)
        lines += [f"rank {r['rank']}: {r['minibatches']} minibatches, {b['remote_rows']:,} remote "
                  f"rows; capacity {r['capacity']:,} rows ({share or '-'})",
                  f"  {'':<26} {'hit %':>6} {'hits':>11} {'fetched rows':>13} "
                  f"{'run hits / its':>15} {'run fetched / its':>18}"]
        if run:
            lines.append(f"  {'run':<26} {100 * run['hit_rate']:>6.1f} {run['hits']:>11,} "
                         f"{run['fetched_rows']:>13,}")
        for opt, hk, fk in ((a, "hits_fraction_of_all_remote", "fetched_ratio_to_all_remote"),
                            (b, "hits_fraction_of_optimal", "fetched_ratio_to_optimal")):
            lines.append(f"  {opt['name']:<26} {100 * opt['hit_rate']:>6.1f} {opt['hits']:>11,} "
                         f"{opt['fetched_rows']:>13,} {f3(r[hk]):>15} {f3(r[fk]):>18}")
        if r.get("note"):
            lines.append(f"  note: {r['note']}")
    lines.append("Belady, all remote nodes (the yardstick): any remote node the trainer pulled may "
                 "be kept; Belady, halo only: 1-hop halo nodes only (what the buffer holds today).")
    return "\n".join(lines)


def main(args) -> int:
    rows = compare_run(args.run_dir, args.start, args.capacity, write=not args.no_write)
    print(format_table(rows))
    if not args.no_write:
        names = ", ".join(f"oracle-r{r['rank']}.json" for r in rows)
        print(f"wrote {names} in {args.run_dir}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="rudder")
    register(parser.add_subparsers())
    a = parser.parse_args()
    raise SystemExit(a.func(a))
