"""Behaviour snapshot for the step-contract refactor (issue 12): replay results of every
simulator engine, the agent's prompts, hindsight gains and the store's rows, as one JSON file.
Run before and after a refactor and diff: `python scripts/i12_snapshot.py OUT.json`."""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from rudder.agent.context import VARIANTS, ContextBuilder
from rudder.agent.hindsight import collect_run, counterfactual_gains
from rudder.records import read_jsonl
from rudder.sim.simulate import simulate, write_sim_run
from rudder.sim.tracegen import random_trace

POLICIES = ["none", "static", "fixed", "fixed:10:0.5", "lookahead", "lookahead:1:0.05:any",
            "lookahead:3:0.01:misses", "collect", "lru", "lfu", "s3fifo", "sieve", "belady"]
DROP = {"seconds", "accesses_per_s", "latency_s", "agent_wait_s"}


def clean(x):
    if isinstance(x, dict):
        return {k: clean(v) for k, v in sorted(x.items()) if k not in DROP}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x


def main(out: str) -> None:
    snap: dict = {"sim": {}, "prompts": {}, "files": {}}
    trace = random_trace(halo=400, minibatches=60, batch=120, nonhalo=0.15, capacity=0.25,
                         skew=0.8, epochs=2, seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = {"path": str(tmp / "t.npz"), "name": "t"}
        trace.save(tmp / "t.npz")
        for pol in POLICIES:
            for start in ("init", "empty"):
                r = simulate(trace, pol, start=start, verify=True)
                snap["sim"][f"{pol}/{start}"] = clean({
                    "summary": r.summary(), "records": r.records(), "epochs": r.epoch_records(),
                    "windows": r.windows, "decisions": r.decisions})
            d = write_sim_run(tmp / "runs", [r], src, run_id=f"sim-{pol.replace(':', '_')}")
            for f in sorted(d.glob("*.jsonl")):
                snap["files"][f"{pol}/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
                snap["files"][f"{pol}/{f.name}/values"] = clean(read_jsonl(f))
        # hindsight on a collected (random agent) run
        t2 = random_trace(halo=600, minibatches=120, batch=120, capacity=0.2, skew=0.8, epochs=2, seed=3)
        p2 = t2.save(tmp / "h" / "trace-r0.npz")
        run = collect_run(p2, tmp / "hruns", window=5, lookahead=4, seed=1)
        snap["hindsight"] = {str(k): v for k, v in counterfactual_gains(run, 0, horizon=2).items()}
        snap["collect_run"] = {f.name: clean(read_jsonl(f)) for f in sorted(run.glob("*.jsonl"))}
        # the store's rows
        from rudder.results.store import ResultsStore

        with ResultsStore(tmp / "r.duckdb") as st:
            st.ingest_runs(sorted((tmp / "runs").iterdir()) + [run], study="snap")
            for table in ("minibatches", "epochs", "windows", "decisions"):
                cols = [c[0] for c in st.con.execute(f"DESCRIBE {table}").fetchall()]
                rows = st.con.execute(f"SELECT * EXCLUDE (extra) FROM {table} ORDER BY ALL").fetchall()
                ex = st.con.execute(f"SELECT extra FROM {table} ORDER BY ALL").fetchall()
                snap[f"store/{table}"] = {"cols": cols, "rows": [[str(v) for v in r] for r in rows],
                                          "extra": sorted(str(e[0]) for e in ex)}
            snap["store/run_cols"] = [c[0] for c in st.con.execute("DESCRIBE runs").fetchall()]
    # prompts for the labelled windows, every variant
    root = Path(__file__).resolve().parents[1] / "rudder" / "agent"
    for name in ("eval_windows.jsonl", "eval_windows_runs.jsonl"):
        for i, rec in enumerate(read_jsonl(root / name)):
            for v in VARIANTS:
                b = ContextBuilder(rec["context"], v, 4)
                p = b.build(rec["window"], rec.get("history") or [], rec.get("recent") or [])
                snap["prompts"][f"{name}#{i}/{v}"] = {
                    "hash": p.hash,
                    "text": hashlib.sha256(json.dumps(p.messages).encode()).hexdigest(),
                    "schema": hashlib.sha256(json.dumps(p.schema, sort_keys=True).encode()).hexdigest()}
    Path(out).write_text(json.dumps(snap, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
