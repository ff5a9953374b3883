"""What one answer of the per-node model server costs in the default study, and where it goes.

    .venv/bin/python benchmarks/bench_agent_node.py RUN_DIR [--calls 8] [--setups threads=1,logits_all=1 threads=1] [--json out.json]

RUN_DIR is an agent run of the study (e.g. runs/local-default/synth-medium-m2-t1-agent-r0-*): its
context-r*.json and windows-r*.jsonl give the real prompts. One AgentService (as the study's node
service: rudder.agent.server, or llama_cpp.server with server=llama_cpp; its log kept) is started and warmed; then the trainers' prompts
are sent one at a time, ranks taking turns as they share the server, each with the history of the
decisions before it (every one answered, measured, so the run's own examples appear as they would).
Per call: the latency, the prompt tokens, how many of them the server had to read (the rest came
from its KV cache: the prefix it shares with the previous prompt) and the tokens generated.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.agent.context import ContextBuilder  # noqa: E402
from rudder.agent.decision import DecisionMaker, HttpBackend  # noqa: E402
from rudder.agent.eval import percentile  # noqa: E402
from rudder.agent.messages import START_WINDOW, HistoryEntry, budget_rows, conclusion  # noqa: E402
from rudder.agent.models import resolve  # noqa: E402
from rudder.agent.service import AgentService  # noqa: E402
from rudder.agent.signals import evidence  # noqa: E402

CTX_KEYS = ("rank", "num_trainers", "part_id", "num_parts", "num_nodes", "partition_nodes",
            "halo_nodes", "capacity", "batch_size", "fanouts", "steps_per_epoch", "epochs",
            "feat_dim", "feat_bytes", "window", "lookahead")


def load_rank(run: Path, rank: int) -> tuple[dict, list[dict]]:
    ctx = json.loads((run / f"context-r{rank}.json").read_text())
    ctx = {k: ctx[k] for k in CTX_KEYS if k in ctx}
    for k in ("part_id", "num_parts"):
        ctx[k] = int(ctx[k])
    windows = [json.loads(line) for line in (run / f"windows-r{rank}.jsonl").read_text().splitlines() if line]
    return ctx, windows


def prompts(run: Path, ranks: int, calls: int, variant: str, history: int) -> list:
    """The prompts the trainers would send, ranks taking turns: each rank's start decision first,
    then its windows in order; every earlier one answered "replace large" and measured."""
    per_rank = []
    for r in range(ranks):
        ctx, windows = load_rank(run, r)
        cb = ContextBuilder(ctx, variant, history)
        start = {"window": START_WINDOW, "first_step": None, "last_step": -1, "minibatches": 0,
                 **{k: windows[0].get(k) for k in ("buffer_fill", "stale_slots", "lookahead_missing")}}
        seq, hist, recent = [], [], []
        for w in [start] + windows:
            p = cb.build(w, hist, recent[-3:])
            # the answer the model gives (what a trainer's kept state holds after the prompt)
            p.answer_text = json.dumps({
                "reason": evidence(w, recent[-1:], ctx["capacity"], True) + conclusion(True),
                "replace": True, "budget": "large", "expected": {"hit_rate": "up", "remote_rows": "down"}})
            seq.append(p)
            judged = dict(w)
            if recent and recent[-1].get("hit_rate") is not None:
                judged["prev_hit_rate"] = recent[-1]["hit_rate"]
            hist.append(HistoryEntry(
                decision=len(hist) + 1, window=w["window"], replace=True, budget="large",
                rows=budget_rows("large", ctx["capacity"]), expected_hit_rate="up",
                expected_remote_rows="down", judged=judged, hit_delta=0.02, rows_delta=-0.05,
                outcome_hit_rate="up", outcome_remote_rows="down", correct=True,
                asked=getattr(p, "asked", None)))  # the exact question (prefix-stable prompts)
            if w["window"] != START_WINDOW:
                recent.append(w)
        per_rank.append(seq)
    out = []
    for i in range(max(map(len, per_rank))):
        out += [(r, seq[i]) for r, seq in enumerate(per_rank) if i < len(seq)]
    return out[:calls]


_PREFIX = re.compile(r"(\d+) prefix-match hit, remaining (\d+) prompt tokens")
_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_GEN = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")


def log_since(path: Path, pos: int) -> tuple[str, int]:
    data = path.read_bytes()
    return data[pos:].decode(errors="replace"), len(data)


def parse_setup(text: str) -> dict:
    """'threads=2,logits_all=1,cpus=1' -> AgentService keyword arguments."""
    out = {"threads": 1, "logits_all": False, "cpus": None}
    for item in filter(None, text.split(",")):
        key, _, val = item.partition("=")
        if key in ("threads", "threads_batch", "cache_mb", "n_batch"):  # AgentService's int keywords
            out[key] = int(val)
        elif key == "logits_all":
            out["logits_all"] = val.lower() in ("1", "true", "yes")
        elif key == "server":  # rudder (choice decoding, the default) or llama_cpp
            out["server"] = val
        elif key == "cpus":
            out["cpus"] = [int(c) for c in val.split("+")]
        else:
            raise SystemExit(f"unknown setup key {key!r} in {text!r} (threads, threads_batch, logits_all, cache_mb, n_batch, cpus, server)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="an agent run directory of the study")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--ranks", type=int, default=None, help="trainers sharing the server (default: all)")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--setups", nargs="+", default=["threads=1"],
                    help="server setups compared side by side, each a server of its own, asked "
                    "in turn for every prompt (same load): e.g. threads=1,logits_all=1 threads=1")
    ap.add_argument("--variant", default="default")
    ap.add_argument("--history", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ranks = args.ranks or len(list(args.run.glob("context-r*.json")))
    seq = prompts(args.run, ranks, args.calls, args.variant, args.history)
    tmp = Path(tempfile.mkdtemp(prefix="rudder-bench-node-"))
    servers, summaries, rows = [], [], {s: [] for s in args.setups}

    def on_term(*_) -> None:  # the servers run in sessions of their own: stop them first
        for entry in servers:
            entry[1].stop()
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    try:
        for i, text in enumerate(args.setups):
            kw = parse_setup(text)
            t0 = time.monotonic()
            svc = AgentService(resolve(args.model), ready_timeout_s=300, model_alias=args.model,
                               log_path=tmp / f"server{i}.log", **kw).start()
            load_s = time.monotonic() - t0
            warm_s = svc.warm(args.variant)
            time.sleep(0.5)  # its timings are logged after the answer: not the first call's
            maker = DecisionMaker(HttpBackend(svc.url, model=args.model), args.model,
                                  max_tokens=args.max_tokens, timeout_s=600)
            servers.append([text, svc, maker, svc.log_path.stat().st_size, load_s, warm_s])
        for n, (rank, p) in enumerate(seq):
            for entry in servers:
                text, svc, maker, pos = entry[:4]
                d = maker.decide(p)
                time.sleep(0.3)  # the server prints its timings after answering
                log_text, entry[3] = log_since(svc.log_path, pos)
                hit = _PREFIX.search(log_text)
                ev, gen = _EVAL.search(log_text), _GEN.search(log_text)
                row = {"setup": text, "call": n, "rank": rank, "latency_s": round(d.latency_s, 2),
                       "valid": d.fallback is None, "reason": d.reason[:80],
                       "cached": int(hit.group(1)) if hit else 0,
                       "read": int(hit.group(2)) if hit else (int(ev.group(2)) if ev else None),
                       "prompt_eval_s": round(float(ev.group(1)) / 1000, 2) if ev else None,
                       "generated": int(gen.group(2)) if gen else None,
                       "gen_s": round(float(gen.group(1)) / 1000, 2) if gen else None,
                       "loadavg": round(os.getloadavg()[0], 1)}
                rows[text].append(row)
                print(json.dumps(row), flush=True)
    finally:
        for entry in servers:
            entry[1].stop()
    for text, svc, maker, pos, load_s, warm_s in servers:
        r = rows[text]
        lat = [x["latency_s"] for x in r]
        summaries.append({
            "setup": text, "model": args.model, "calls": len(r), "ranks": ranks,
            "load_s": round(load_s, 1), "warm_s": round(warm_s, 1),
            "p50_s": round(percentile(lat, 0.5), 2), "p95_s": round(percentile(lat, 0.95), 2),
            "mean_read": round(sum(x["read"] or 0 for x in r) / max(1, len(r))),
            "prompt_eval_s_p50": round(percentile([x["prompt_eval_s"] or 0 for x in r], 0.5), 2),
            "gen_s_p50": round(percentile([x["gen_s"] or 0 for x in r], 0.5), 2),
            "valid": sum(x["valid"] for x in r), "loadavg_mean": round(
                sum(x["loadavg"] for x in r) / max(1, len(r)), 1)})
        print(json.dumps(summaries[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"summaries": summaries, "calls": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
