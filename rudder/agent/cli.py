"""`rudder agent ...`: score models and prompts, serve a model, probe one decision.

  rudder agent models                       registry: names, sources, present here or not
  rudder agent eval [--model M ...] [--variant V ...] [--windows F ...]   accuracy, latency p50/p95
  rudder agent label RUN_DIR [-o F]         labelled windows from a finished run
  rudder agent judge RUN_DIR ...            every decision against its counterfactual (correct_cf)
  rudder agent serve [--model M] [--host H] [--port P]   the node's model server (foreground)
  rudder agent decide --window JSON [--context JSON] [--history JSON]  one decision, printed
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rudder.arg_types import positive


def _json_arg(value: str | None, option: str, kind: type = dict):
    """Inline JSON, or a path to a JSON file; it must hold a `kind` (dict or list)."""
    if value is None:
        return None
    v = value.strip()
    inline = v[:1] in "{["
    if not inline and not Path(v).is_file():
        what = "a directory, not a JSON file" if Path(v).is_dir() else "neither inline JSON nor a file"
        raise ValueError(f"{option} {v}: {what}")
    try:
        data = json.loads(v if inline else Path(v).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option} {v[:80]}: not JSON ({exc.msg})") from None
    if not isinstance(data, kind):
        raise ValueError(f"{option} {v[:80]}: not a JSON {'object' if kind is dict else 'list'}")
    return data


def _out_path(value: str | None, option: str) -> None:
    """An output file, checked before the work that fills it (a long eval is not lost to a
    typo): not a directory, in a directory that exists and takes the file."""
    if value is None:
        return
    p = Path(value)
    if p.is_dir():
        raise ValueError(f"{option} {value} is a directory, not a file")
    if not p.parent.is_dir():
        raise FileNotFoundError(f"{option} {value}: no directory {p.parent}")
    if p.exists():  # not opened: an existing file stays as it is until the work succeeds
        if not os.access(p, os.W_OK):
            raise ValueError(f"{option} {value}: cannot write there (permission denied)")
        return
    try:
        p.touch()
        p.unlink()
    except OSError as exc:
        raise ValueError(f"{option} {value}: cannot write there ({exc.strerror})") from None


def _check_url(url: str | None) -> None:
    """--url: an http(s) address (whether its server answers, the strict warm-up says:
    DecisionMaker.warm)."""
    if url is None:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r} is not an http(s)://host[:port] address")
    try:
        parts.port  # a port that is not a number, or over 65535, raises here
    except ValueError:
        raise ValueError(f"--url {url!r}: the port is not a number from 0 to 65535") from None


def _horizon(value: str) -> int:
    """--horizon: a whole number of windows, at least 1 (0 windows judge nothing: every decision
    would read neutral)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of windows") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least 1 window is needed (default 2)")
    return n


def _models(args) -> int:
    from rudder.agent.models import main as models_main

    return models_main(["list"])


def _eval(args) -> int:
    from rudder.agent.eval import DEFAULT_SETS, evaluate_many, format_table

    def progress(r, total: int) -> None:  # one line per window on stderr: answers take seconds
        print(f"{r.model} / {r.variant}: {r.n}/{total} windows, {r.correct} right, "
              f"{r.fallbacks} fell back", file=sys.stderr, flush=True)

    _out_path(args.json, "--json")
    _check_url(args.url)
    results = evaluate_many(args.windows or DEFAULT_SETS, args.model or ["smollm2-135m"],
                            args.variant or ["default"], url=args.url, threads=args.threads,
                            timeout_s=args.timeout, limit=args.limit, model_path=args.model_path,
                            pause_file=args.pause_file, progress=None if args.quiet else progress)
    rows = [r.summary() for r in results]
    print(format_table(rows))
    for r in results:  # accuracy per split (tune / held-out) and per kind of window
        parts = [f"{k} {c}/{n}" for key in ("split", "kind") for k, (c, n) in r.by(key).items()]
        print(f"{r.model} / {r.variant}: " + ", ".join(parts))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{**r.summary(), "predictions": r.predictions} for r in results], indent=2))
    return 0


def _label(args) -> int:
    from rudder.agent.eval import label_windows_from_run, write_jsonl

    _out_path(args.output, "-o")
    recs = label_windows_from_run(args.run_dir, horizon=args.horizon, by=args.by, scenario=args.scenario)
    if args.by == "counterfactual":
        from rudder.agent.eval import label_balance

        b = label_balance(recs)["all"]
        print(f"counterfactual labels: {b['n']} windows, {b['replace']} replace, {b['keep']} keep")
    if args.check:  # the counterfactual of a replayed run: both branches from the same state
        from rudder.agent.hindsight import check_labels

        recs = check_labels(recs, args.run_dir, horizon=args.horizon)
        judged = [r for r in recs if r["agrees"] is not None]
        print(f"hindsight check: {sum(r['agrees'] for r in judged)} of {len(judged)} labels agree "
              f"with the counterfactual ({len(recs) - len(judged)} too close to call)")
        if args.agreed_only:
            recs = [r for r in recs if r["agrees"]]
    if args.output:
        write_jsonl(recs, args.output)
        print(f"{len(recs)} labelled windows -> {args.output}")
    else:
        for r in recs:
            print(json.dumps(r))
    return 0


def _judge(args) -> int:
    from rudder.agent.hindsight import judge_run, summarize

    for run_dir in args.run_dir:
        by_rank = judge_run(run_dir, horizon=args.horizon, write=not args.dry_run)
        s = summarize([d for recs in by_rank.values() for d in recs])
        (c, n), (cc, cn) = s["pass_at_1"], s["pass_at_1_cf"]
        print(f"{run_dir}: {s['judged']} of {s['decisions']} decisions judged; replacing saves at "
              f"{s['saves']}, costs at {s['costs']}, neutral at {s['neutral']}; Pass@1 before/after "
              f"{c}/{n}, counterfactual {cc}/{cn}")
    return 0


def _serve(args) -> int:
    from rudder.agent.service import main as service_main

    argv = ["--model", args.model, "--port", str(args.port), "--threads", str(args.threads)]
    if args.host:
        argv += ["--host", args.host]
    if args.model_path:
        argv += ["--model-path", args.model_path]
    return service_main(argv)


def _decide(args) -> int:
    from rudder.agent.context import ContextBuilder
    from rudder.agent.decision import DecisionMaker
    from rudder.agent.eval import make_backend

    window = _json_arg(args.window, "--window")
    recent: list = []
    if isinstance(window.get("window"), dict):  # a whole labelled record (eval file line)
        rec = window
        window, recent = rec["window"], rec.get("recent") or []
        args.context = args.context or json.dumps(rec.get("context") or {})
        args.history = args.history or json.dumps(rec.get("history") or [])
    ctx = _json_arg(args.context, "--context") or {}
    history = _json_arg(args.history, "--history", list) or []
    _check_url(args.url)
    builder = ContextBuilder(ctx, args.variant)
    prompt = builder.build(window, history, recent)
    if args.show_prompt:
        for m in prompt.messages:
            print(f"--- {m['role']}\n{m['content']}")
    maker = DecisionMaker(make_backend(args.model, args.url, args.threads, args.model_path), args.model,
                          timeout_s=args.timeout)
    try:
        if args.url:  # the server must answer: a fallback would read as its decision
            maker.warm(prompt, strict=True)
        d = maker.decide(prompt)
    finally:
        maker.close()
    print(json.dumps({k: v for k, v in d.to_record().items() if v is not None}, indent=2))
    return 0


def register(subparsers) -> None:
    from rudder.agent.service import DEFAULT_PORT, tcp_port

    p = subparsers.add_parser("agent", help="the LLM agent: eval, serve, decide",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="agent_command", metavar="ACTION")

    def common(q, many: bool):
        if many:
            q.add_argument("--model", action="append", help="model name (repeatable; default smollm2-135m)")
        else:
            q.add_argument("--model", default="smollm2-135m", help="model name (rudder agent models)")
        q.add_argument("--model-path", default=None, help="GGUF file for a user-supplied model")
        q.add_argument("--url", default=None, help="OpenAI-compatible server instead of in-process")
        q.add_argument("--threads", type=positive(int), default=2, help="llama.cpp threads")
        q.add_argument("--timeout", type=positive(float), default=60.0, help="seconds per answer")

    q = sub.add_parser("models", help="list the model registry")
    q.set_defaults(func=_models)

    q = sub.add_parser("eval", help="score model(s) x prompt variant(s) on labelled windows")
    common(q, many=True)
    q.add_argument("--variant", action="append", help="prompt variant (repeatable; default: default)")
    q.add_argument("--windows", action="append", default=None,
                   help="labelled windows JSONL (repeatable; default: the starter set and the "
                        "windows of replayed runs, rudder/agent/eval_windows*.jsonl)")
    q.add_argument("--limit", type=positive(int), default=None, metavar="N",
                   help="score only the first N windows (of the files in order; default all)")
    q.add_argument("--quiet", action="store_true", help="no per-window progress on stderr")
    q.add_argument("--pause-file", default=None,
                   help="wait while this file exists before each window (a shared host where "
                        "someone times a benchmark); the wait is not counted as latency")
    q.add_argument("--json", default=None, help="write summaries and per-window predictions here")
    q.set_defaults(func=_eval)

    q = sub.add_parser("label", help="labelled windows from a finished run's records")
    q.add_argument("run_dir")
    q.add_argument("-o", "--output", default=None)
    q.add_argument("--horizon", type=_horizon, default=2)
    q.add_argument("--check", action="store_true",
                   help="replayed runs: check each label against the counterfactual (both "
                        "branches replayed from the same buffer state; rudder.agent.hindsight)")
    q.add_argument("--agreed-only", action="store_true",
                   help="with --check: keep only the windows whose label the counterfactual confirms")
    q.add_argument("--by", choices=("outcome", "counterfactual"), default="outcome",
                   help="counterfactual: label each judged decision's window by what replacing saved "
                        "against keeping (needs `rudder agent judge` first)")
    q.add_argument("--scenario", default=None, help="recorded on each window (held-out splits)")
    q.set_defaults(func=_label)

    q = sub.add_parser("judge", help="judge a run's decisions against their counterfactual "
                       "(sets correct_cf, cf_rows_saved, cf_replace_share)",
                       description="Replays each decision's branch and its alternative (replace vs "
                       "keep) from the same buffer state over the next windows, on a simulated "
                       "run or a live run that kept its traces. A live run judges itself at the "
                       "default horizon as it completes (run.json `judge`); judge again to use "
                       "another horizon (run.json `judge` then names it, and the report quotes "
                       "it). Collect the run again afterwards to update the store.")
    q.add_argument("run_dir", nargs="+", help="run directories (simulated, or live with trace-r*.npz)")
    q.add_argument("--horizon", type=_horizon, default=2,  # hindsight.HORIZON (it imports torch)
                   help="windows replayed after each decision (default 2). A round whose rows pay "
                        "back over more windows is judged a cost over fewer: on the 1M-node "
                        "synth-bench rounds pay back over 4-8 windows (BENCHMARKS 7z), so judge "
                        "there at 4 or more and quote the horizon with the Pass@1")
    q.add_argument("--dry-run", action="store_true", help="print only; leave the records as they are")
    q.set_defaults(func=_judge)

    q = sub.add_parser("serve", help="serve a model for this node's trainers (foreground)")
    q.add_argument("--model", default="smollm2-135m")
    q.add_argument("--model-path", default=None)
    q.add_argument("--host", default=None, help="default $RUDDER_MACHINE_ADDR or 127.0.0.1")
    q.add_argument("--port", type=tcp_port, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: a free one")
    q.add_argument("--threads", type=positive(int), default=1)
    q.set_defaults(func=_serve)

    q = sub.add_parser("decide", help="one decision on a window, printed (manual probe)")
    common(q, many=False)
    q.add_argument("--window", required=True,
                   help="WINDOW_FIELDS record, or a whole labelled record (eval file line): JSON or a file")
    q.add_argument("--context", default=None, help="RunContext-like dict: JSON or a file")
    q.add_argument("--history", default=None, help="list of past decisions: JSON or a file")
    q.add_argument("--variant", default="default")
    q.add_argument("--show-prompt", action="store_true")
    q.set_defaults(func=_decide)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
