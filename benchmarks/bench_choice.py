"""Choice decoding against llama.cpp's grammar, side by side on the same prompts and model.

    .venv/bin/python benchmarks/bench_choice.py [--model smollm2-135m] [--windows rudder/agent/eval_windows.jsonl ...]
        [--run RUN_DIR --ranks 2 --calls 12] [--threads 1] [--json out.json]

Per prompt, in one process (same load for both): the grammar path (create_chat_completion under
the schema, greedy; InprocBackend's old path) and the choice decoder (rudder.agent.choice) each
answer it after the same prompt prefix sits in the KV cache (each is first run once on the
prompt's predecessor so both read only the part that changed). Reports per-answer latency of
each, their ratio, and how often the two answers agree (every field; and `replace` alone).
--run: the study's real prompts (benchmarks/bench_agent_node.prompts: ranks taking turns).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.agent.choice import ChoiceDecoder, template  # noqa: E402
from rudder.agent.context import ContextBuilder  # noqa: E402
from rudder.agent.messages import Answer  # noqa: E402
from rudder.agent.models import resolve  # noqa: E402


def eval_prompts(paths: list[str], variant: str) -> list:
    out = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out.append(ContextBuilder(rec["context"], variant).build(
                    rec["window"], rec.get("history") or [], rec.get("recent") or []))
    return out


def grammar_answer(llm, prompt, max_tokens: int = 160) -> str:
    res = llm.create_chat_completion(messages=prompt.messages, max_tokens=max_tokens, temperature=0.0,
                                     response_format={"type": "json_object", "schema": prompt.schema})
    return res["choices"][0]["message"]["content"]


def parse(text: str) -> dict | None:
    try:
        return Answer.model_validate_json(text).model_dump()
    except Exception:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", nargs="*", default=[])
    ap.add_argument("--run", default=None)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--variant", default="default")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from llama_cpp import Llama

    prompts = eval_prompts(args.windows, args.variant)
    if args.run:
        from bench_agent_node import prompts as run_prompts

        prompts += [p for _, p in run_prompts(Path(args.run), args.ranks, args.calls, args.variant, 4)]
    if args.limit:
        prompts = prompts[: args.limit]
    llm = Llama(model_path=str(resolve(args.model)), n_ctx=4096, n_threads=args.threads,
                n_threads_batch=args.threads, seed=0, verbose=False)
    dec = ChoiceDecoder(llm)
    t0 = time.monotonic()
    _ = dec.vocab
    vocab_s = time.monotonic() - t0
    rows = []
    for i, p in enumerate(prompts):
        tpl = template(p.schema)
        prev = prompts[i - 1] if i else p
        # grammar: its predecessor first (the KV cache then holds what a server would hold)
        dec.read(dec.prompt_tokens(prev.messages))
        t = time.monotonic()
        g = grammar_answer(llm, p)
        g_s = time.monotonic() - t
        dec.read(dec.prompt_tokens(prev.messages))
        t = time.monotonic()
        c, finish, st = dec.complete(p.messages, tpl)
        c_s = time.monotonic() - t
        ga, ca = parse(g), parse(c)
        rows.append({"i": i, "grammar_s": g_s, "choice_s": c_s, "read_tokens": st["read_tokens"],
                     "read_s": st["read_s"], "choices": st["choices"], "gen_tokens": st["generated_tokens"],
                     "finish": finish, "valid": ca is not None, "grammar_valid": ga is not None,
                     "agree": ga == ca, "agree_replace": (ga or {}).get("replace") == (ca or {}).get("replace"),
                     "grammar": g, "choice": c})
        r = rows[-1]
        print(f"{i:3d} grammar {g_s:5.2f}s choice {c_s:5.2f}s (read {r['read_tokens']} tok {r['read_s']:.2f}s, "
              f"{r['choices']} choices) agree={r['agree']} replace={r['agree_replace']}", flush=True)
        if not r["agree"]:
            print("    g:", g, "\n    c:", c)
    n = len(rows)
    summ = {"model": args.model, "prompts": n, "vocab_trie_s": vocab_s,
            "grammar_median_s": statistics.median(r["grammar_s"] for r in rows),
            "choice_median_s": statistics.median(r["choice_s"] for r in rows),
            "valid": sum(r["valid"] for r in rows), "agree": sum(r["agree"] for r in rows),
            "agree_replace": sum(r["agree_replace"] for r in rows)}
    summ["ratio"] = summ["choice_median_s"] / summ["grammar_median_s"]
    print(json.dumps(summ, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summ, "rows": rows}, indent=1))
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
