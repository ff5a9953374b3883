"""Decision latency of the agent, p50/p95, per backend and model.

    .venv/bin/python benchmarks/bench_agent.py                       # smollm2, inproc + http
    .venv/bin/python benchmarks/bench_agent.py --models smollm2-135m qwen2.5-coder-0.5b --n 8
    .venv/bin/python benchmarks/bench_agent.py --backends inproc --variant zero-shot --json out.json

Each model x backend: load (inproc: llama_cpp.Llama; http: an AgentService on 127.0.0.1), warm
the constant prompt prefix once (what AgentPolicy and the service do at start), then decide on
the first N starter windows. Reported: load and warm-up seconds, latency p50/p95, valid share,
and the load average (the numbers mean little on a busy machine).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.agent.context import ContextBuilder  # noqa: E402
from rudder.agent.decision import DecisionMaker, HttpBackend, InprocBackend, warm_prompt  # noqa: E402
from rudder.agent.eval import STARTER, load_windows, percentile  # noqa: E402
from rudder.agent.models import ModelError, resolve  # noqa: E402
from rudder.agent.service import AgentService  # noqa: E402


def bench(model: str, backend: str, windows: list[dict], variant: str, threads: int, timeout: float) -> dict:
    path = resolve(model)
    t0 = time.monotonic()
    svc = None
    if backend == "inproc":
        be = InprocBackend(path, threads=threads)
    else:
        svc = AgentService(path, threads=threads, ready_timeout_s=300, model_alias=model).start()
        be = HttpBackend(svc.url, model=model)
    load_s = time.monotonic() - t0
    maker = DecisionMaker(be, model, timeout_s=timeout)
    try:
        warm_s = maker.warm(warm_prompt(variant))
        lat, valid = [], 0
        for rec in windows:
            p = ContextBuilder(rec["context"], variant).build(rec["window"], rec.get("history") or [],
                                                              rec.get("recent") or [])
            d = maker.decide(p)
            lat.append(d.latency_s)
            valid += d.fallback is None
    finally:
        maker.close()
        if svc:
            svc.stop()
    return {"model": model, "backend": backend, "variant": variant, "threads": threads, "n": len(windows),
            "load_s": round(load_s, 2), "warm_s": round(warm_s, 2),
            "p50_s": round(percentile(lat, 0.5), 3), "p95_s": round(percentile(lat, 0.95), 3),
            "valid": round(valid / max(1, len(windows)), 3), "loadavg": round(os.getloadavg()[0], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--backends", nargs="+", default=["inproc", "http"], choices=["inproc", "http"])
    ap.add_argument("--variant", default="default")
    ap.add_argument("--n", type=int, default=6, help="windows per model x backend")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    windows = load_windows(STARTER)[: args.n]
    rows = []
    for model in args.models:
        for backend in args.backends:
            try:
                r = bench(model, backend, windows, args.variant, args.threads, args.timeout)
            except ModelError as exc:
                print(f"skip {model}: {exc}", file=sys.stderr)
                break
            rows.append(r)
            print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
