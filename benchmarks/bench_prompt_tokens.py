"""Tokens per question of the agent's prompts, counted with a model's own tokenizer (issue 16).

What a node's model server reads per answer is the prompt minus the prefix it still holds in its
KV cache: the system text and canned examples that every prompt shares (warmed at start), and
for a run's prompts (ranks taking turns on one server) whatever more it shares with the question
answered just before. This counts, per prompt: all tokens, the tokens shared
with the warm-up prompt (the cached prefix) and the rest (read per answer), plus the tokens of
the run's facts line and how often that line appears. With --run, the server keeps each
trainer's last prompt and answer (rudder.agent.server --cache-mb): `read` is what is left after
the longest prefix shared with any kept state or the warm-up prompt, `suffix` what is left after
the prefix shared with the same trainer's previous prompt and answer (issue 16's measure).

    python benchmarks/bench_prompt_tokens.py                       # the labelled eval windows
    python benchmarks/bench_prompt_tokens.py --run RUN_DIR --calls 12   # a study run's prompts
    python benchmarks/bench_prompt_tokens.py --model qwen2.5-coder-0.5b --json out.json

Prompts of a run (RUN_DIR: context-r*.json, windows-r*.jsonl) are built as
benchmarks/bench_agent_node.py builds them: every earlier window answered "replace large" and
measured (so the run's own examples appear, the costly case). Only the tokenizer is loaded
(llama.cpp vocab_only): no inference. Chat format: ChatML (Qwen2.5 and SmolLM2 both use it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.agent.context import ContextBuilder  # noqa: E402
from rudder.agent.decision import warm_prompt  # noqa: E402
from rudder.agent.eval import DEFAULT_SETS, load_windows  # noqa: E402


def chatml(messages: list[dict]) -> str:
    """The text a ChatML model reads (Qwen2.5's and SmolLM2's template), generation prompt last."""
    from llama_cpp.llama_chat_format import format_chatml

    return format_chatml(messages).prompt


class Tokens:
    """A model's tokenizer only (llama.cpp, vocab_only)."""

    def __init__(self, model: str):
        from llama_cpp import Llama

        from rudder.agent.models import resolve

        path = resolve(model, model if model.endswith(".gguf") else None, verify=False)
        self.llm = Llama(model_path=str(path), vocab_only=True, verbose=False)

    def __call__(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=True)


def common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def count(tok: Tokens, prompt, warm_ids: list[int], facts: str, kept: dict | None = None,
          rank: int | None = None) -> dict:
    """`kept`: the states the server holds (rank -> its last prompt + answer tokens, as
    rudder.agent.server keeps them per trainer); the server resumes from the one (or the warm-up
    prompt) sharing the longest prefix: `read` is what it then reads. `suffix`: what is left
    after the prefix shared with this trainer's own previous prompt and answer (else the
    warm-up prompt) -- the prompt's non-shared suffix."""
    ids = tok(chatml(prompt.messages))
    kept = kept or {}
    warm = common(ids, warm_ids)
    cached = max([warm] + [common(ids, k) for k in kept.values()])
    own = max(warm, common(ids, kept[rank])) if rank in kept else warm
    text = "".join(m["content"] for m in prompt.messages)
    final = prompt.messages[-1]["content"]
    return {"tokens": len(ids), "cached": cached, "read": len(ids) - cached, "suffix": len(ids) - own,
            "final_message": len(tok(final)), "facts": len(tok(facts)),
            "facts_times": text.count(facts), "examples": (len(prompt.messages) - 2) // 2}


def eval_prompts(variant: str, history: int) -> list:
    out = []
    for rec in load_windows(DEFAULT_SETS):
        cb = ContextBuilder(rec["context"], variant, history)
        out.append((cb, cb.build(rec["window"], rec.get("history") or [], rec.get("recent") or [])))
    return out


def run_prompts(run: Path, calls: int, variant: str, history: int) -> list:
    from bench_agent_node import load_rank, prompts

    ranks = len(list(run.glob("context-r*.json")))
    builders = {r: ContextBuilder(load_rank(run, r)[0], variant, history) for r in range(ranks)}
    return [(builders[r], p) for r, p in prompts(run, ranks, calls, variant, history)]


def summary(rows: list[dict]) -> dict:
    keys = ["tokens", "cached", "read", "suffix", "final_message", "facts", "facts_times", "examples"]
    return {k: {"median": statistics.median(r[k] for r in rows), "max": max(r[k] for r in rows),
                "mean": round(statistics.mean(r[k] for r in rows), 1)}
            for k in keys} | {"n": len(rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="whose tokenizer (name or .gguf path)")
    ap.add_argument("--variant", default="default")
    ap.add_argument("--history", type=int, default=4)
    ap.add_argument("--run", type=Path, help="a run directory instead of the labelled eval windows")
    ap.add_argument("--calls", type=int, default=12, help="prompts of the run (ranks taking turns)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tok = Tokens(args.model)
    warm_ids = tok(chatml(warm_prompt(args.variant).messages))
    pairs = (run_prompts(args.run, args.calls, args.variant, args.history) if args.run
             else eval_prompts(args.variant, args.history))
    rows, kept = [], {}
    for cb, p in pairs:
        rows.append(count(tok, p, warm_ids, cb.static_text(), kept, cb.ctx.rank) | {"rank": cb.ctx.rank})
        if args.run:  # ranks take turns on one server, which keeps each one's prompt and answer
            kept[cb.ctx.rank] = tok(chatml(p.messages)) + tok(p.answer_text)
    out = {"model": args.model, "variant": args.variant, "source": str(args.run or "eval windows"),
           "prompt_hash": pairs[0][1].hash, "summary": summary(rows), "prompts": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    s = out["summary"]
    print(f"{args.model} {args.variant} ({out['source']}, {s['n']} prompts, hash {out['prompt_hash']}): "
          + "; ".join(f"{k} median {v['median']} max {v['max']}" for k, v in s.items() if k != "n"))
    if args.run:
        for r in rows:
            print(f"  rank {r['rank']}  tokens {r['tokens']:5d}  cached {r['cached']:5d}  read {r['read']:4d}  "
                  f"suffix {r['suffix']:4d}  "
                  f"final {r['final_message']:4d}  examples {r['examples']}  facts x{r['facts_times']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
