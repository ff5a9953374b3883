"""What the answer's grammar costs per generated token (issue 16).

    python benchmarks/bench_answer_grammar.py [--model qwen2.5-coder-0.5b] [--reps 2]

One in-process llama.cpp model (1 thread, no logits for prompt tokens, as the node server), the
warm-up prompt (system text, canned examples, a starter window); the same answer generated with
and without the answer's JSON schema as a grammar (streamed: time per token after the first).
llama.cpp applies the grammar to every candidate of the vocabulary at each token (151,936 for
Qwen2.5), and the answer's schema fixes most of its tokens (the keys, and a reason from a fixed
pattern): see BENCHMARKS.md section 6.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.agent.decision import warm_prompt  # noqa: E402
from rudder.agent.models import resolve  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=45)
    args = ap.parse_args()
    from llama_cpp import Llama

    p = warm_prompt()
    llm = Llama(model_path=str(resolve(args.model)), n_ctx=4096, n_threads=1, n_threads_batch=1,
                logits_all=False, verbose=False)
    for rep in range(args.reps):
        for mode in ("grammar", "free"):
            kw = {"response_format": {"type": "json_object", "schema": p.schema}} if mode == "grammar" else {}
            t0 = time.monotonic()
            first, n, text = None, 0, ""
            for ch in llm.create_chat_completion(messages=p.messages, max_tokens=args.max_tokens,
                                                 temperature=0.0, stream=True, **kw):
                c = ch["choices"][0].get("delta", {}).get("content")
                if c:
                    first = first or time.monotonic()
                    n += 1
                    text += c
            t1 = time.monotonic()
            print(f"{mode} rep {rep}: first token after {first - t0:.2f} s; {n} tokens, "
                  f"{(t1 - first) / max(1, n - 1) * 1e3:.0f} ms per token after the first; {text[:70]!r}",
                  flush=True)
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
