"""`rudder agent eval`: the starter set, scoring, labelling windows of a finished run, the CLI."""
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rudder.agent.decision import Completion, DecisionMaker
from rudder.agent.messages import conclusion
from rudder.agent.eval import (
    STARTER,
    evaluate,
    evaluate_many,
    label_windows_from_run,
    load_windows,
    make_starter_windows,
    percentile,
)
from rudder.records import DECISION_FIELDS, WINDOW_FIELDS


class RuleBackend:
    """Answers by reading the hit-rate trend word the prompt shows (a stand-in for a good model)."""

    name = "rule"

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None):
        replace = "falling" in messages[-1]["content"]
        return Completion(json.dumps({"reason": "rule" + conclusion(replace), "replace": replace, "budget": "medium",
                                      "expected": {"hit_rate": "up", "remote_rows": "down"}}), "stop")

    def close(self):
        pass


@pytest.mark.parametrize("text, needle", [('{"context": {}, "window": {}, "label_replace": true}\n{oops\n',
                                            ":2: not a labelled window (JSON)"),
                                           ("[1, 2]\n", ":1: not a labelled window (a JSON object)"),
                                           ('{"context": {}}\n', ":1: labelled window lacks 'window'")])
def test_a_bad_windows_file_is_named_with_its_line(tmp_path, text, needle):
    bad = tmp_path / "w.jsonl"
    bad.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"{bad}{needle}")):
        load_windows(bad)


def test_starter_set_is_balanced_unambiguous_and_reproducible():
    recs = load_windows(STARTER)
    assert len(recs) >= 20
    assert sum(r["label_replace"] for r in recs) == len(recs) // 2
    assert recs == json.loads(json.dumps(make_starter_windows()))  # the file is what the generator makes
    for r in recs:
        assert set(WINDOW_FIELDS) <= set(r["window"])
        cap = r["context"]["capacity"]
        w = r["window"]
        if r["label_replace"]:
            assert w["hit_rate"] < 0.36 and w["hit_rate"] < r["recent"][-1]
            assert w["stale_slots"] > 0.4 * cap and w["lookahead_missing"] > 0.35 * cap
        else:
            assert w["hit_rate"] > 0.5 and w["stale_slots"] <= 0.1 * cap and w["lookahead_missing"] <= 0.05 * cap


def test_evaluate_scores_accuracy_and_latency():
    maker = DecisionMaker(RuleBackend(), "rule")
    res = evaluate(maker, load_windows(STARTER), "reason-first")
    s = res.summary()
    assert s["n"] == 24 and s["accuracy"] == 1.0 and s["fallbacks"] == 0
    assert s["latency_p50_s"] is not None and s["latency_p95_s"] >= s["latency_p50_s"]
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([], 0.5) is None


class KeepBackend(RuleBackend):
    """Always keep: the constant answer the majority baseline stands for."""

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None):
        return Completion(json.dumps({"reason": "keep" + conclusion(False), "replace": False, "budget": "small",
                                      "expected": {"hit_rate": "flat", "remote_rows": "flat"}}), "stop")


class ReplaceBackend(RuleBackend):
    """Always replace: the other constant answer."""

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None):
        return Completion(json.dumps({"reason": "replace" + conclusion(True), "replace": True, "budget": "medium",
                                      "expected": {"hit_rate": "up", "remote_rows": "down"}}), "stop")


def test_majority_baseline_is_what_a_constant_answer_scores():
    seen = []
    windows = load_windows(STARTER)[:9]  # 4 keep, 5 replace: counted below, not assumed
    n_keep = sum(not w["label_replace"] for w in windows)
    keep, replace = n_keep / len(windows), (len(windows) - n_keep) / len(windows)
    res = evaluate(DecisionMaker(KeepBackend(), "keep"), windows, "default",
                   progress=lambda r, total: seen.append((r.n, total)))
    rep = evaluate(DecisionMaker(ReplaceBackend(), "replace"), windows, "default")
    # each constant answer is right on exactly the windows labelled with it
    assert res.accuracy == keep and rep.accuracy == replace
    label, share = res.majority
    assert share == max(res.accuracy, rep.accuracy) and label == ("keep" if keep > 0.5 else "replace")
    assert rep.majority == res.majority  # the baseline depends on the labels, not the answers
    s = res.summary()
    assert (s["majority"], s["majority_answer"], s["replace_share"]) == (round(share, 3), label, 0.0)
    assert rep.summary()["replace_share"] == 1.0
    assert seen == [(i, 9) for i in range(1, 10)]  # progress after every window


@pytest.mark.slow  # loads SmolLM2
def test_eval_cli_in_process_with_smollm2(capsys):
    """`rudder agent eval` as a newcomer runs it (README), on two windows."""
    from rudder.cli import main

    assert main(["agent", "eval", "--model", "smollm2-135m", "--limit", "2", "--threads", "2",
                 "--timeout", "300"]) == 0
    out, err = capsys.readouterr()
    header, row = out.splitlines()[:2]
    cells = dict(zip(header.split(), row.split()))
    assert cells["model"] == "smollm2-135m" and cells["backend"] == "inproc" and cells["n"] == "2"
    assert 0.0 <= float(cells["accuracy"]) <= 1.0 and cells["fallbacks"] == "0"
    assert cells["majority_answer"] in ("keep", "replace") and float(cells["majority"]) >= 0.5
    assert "smollm2-135m / default: 2/2 windows" in err  # progress on stderr


class OkHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        replace = "falling" in req["messages"][-1]["content"]
        content = json.dumps({"reason": "r" + conclusion(replace), "replace": replace, "budget": "small",
                              "expected": {"hit_rate": "up", "remote_rows": "down"}})
        body = json.dumps({"choices": [{"message": {"content": content}, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def ok_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), OkHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_evaluate_many_over_http_and_cli(ok_server, tmp_path, capsys):
    rs = evaluate_many(STARTER, ["m"], ["zero-shot", "default"], url=ok_server, limit=6)
    assert [(r.variant, r.n, r.accuracy) for r in rs] == [("zero-shot", 6, 1.0), ("default", 6, 1.0)]
    from rudder.cli import main

    out = tmp_path / "eval.json"
    assert main(["agent", "eval", "--url", ok_server, "--model", "m", "--variant", "signals", "--limit", "4",
                 "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "signals" in table and "accuracy" in table
    data = json.loads(out.read_text())
    assert data[0]["n"] == 4 and len(data[0]["predictions"]) == 4
    w = json.dumps(load_windows(STARTER)[0]["window"])
    assert main(["agent", "decide", "--url", ok_server, "--model", "m", "--window", w]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["backend"] == "http" and "replace" in d


def _write_run(tmp_path, windows, decisions=None):
    run = tmp_path / "run-1"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"contexts": {"0": {"capacity": 1000, "halo_nodes": 4000}}}))
    (run / "windows-r0.jsonl").write_text("".join(json.dumps(w) + "\n" for w in windows))
    if decisions is not None:
        (run / "decisions-r0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))
    return run


def W(i, hit, replaced=0, remote=10_000):
    return {"window": i, "first_step": 10 * i, "last_step": 10 * i + 9, "minibatches": 10, "hit_rate": hit,
            "remote_rows": remote, "fetched_rows": int(remote * (1 - hit)) + replaced, "replaced_rows": replaced,
            "stale_slots": 100, "buffer_fill": 1000, "lookahead_missing": 50, "lookahead_rows": 50}


def D(n, window, replace, applied, fallback=None):
    d = {k: None for k in DECISION_FIELDS}
    d.update(decision=n, window=window, replace=replace, applied_step=applied, fallback=fallback,
             budget="medium" if replace else "small", expected_hit_rate="up", expected_remote_rows="down")
    return d


def test_label_windows_from_run_with_decisions(tmp_path):
    windows = [W(0, 0.30), W(1, 0.36, replaced=500), W(2, 0.37), W(3, 0.37),  # paid: +6/+7 pt x 10k - 500
               W(4, 0.40, replaced=900), W(5, 0.40), W(6, 0.395),  # did not pay: +0 pt, cost 900 rows
               W(7, 0.40), W(8, 0.35)]
    decisions = [D(1, 0, True, 12), D(2, 3, True, 41), D(3, 5, False, 53), D(4, 6, False, 63),
                 D(5, 7, False, 72), D(6, 2, True, None), D(7, 1, True, 15, fallback="static")]
    run = _write_run(tmp_path, windows, decisions)
    recs = {r["source"].split(":w")[-1]: r for r in label_windows_from_run(run)}
    assert recs["0"]["label_replace"] is True and recs["0"]["net_rows"] == pytest.approx(600 + 700 - 500)
    assert recs["3"]["label_replace"] is False and recs["3"]["net_rows"] < 0
    assert recs["5"]["label_replace"] is False  # kept, hit rate held (-0.5 pt)
    assert recs["6"]["label_replace"] is False  # kept, next window +0.5 pt
    assert "7" not in recs  # kept and the hit rate fell 5 pt: unclear, unlabelled
    assert "2" not in recs and "1" not in recs  # never applied / fallback: skipped
    assert recs["3"]["context"]["capacity"] == 1000 and len(recs["3"]["recent"]) == 3
    assert [h["decision"] for h in recs["3"]["history"]] == [1]


def test_label_windows_from_run_without_decisions(tmp_path):
    run = _write_run(tmp_path, [W(0, 0.30), W(1, 0.40, replaced=200), W(2, 0.41), W(3, 0.41)])
    recs = label_windows_from_run(run)
    assert [(r["window"]["window"], r["label_replace"]) for r in recs] == [(0, True), (1, False), (2, False)]


def test_eval_waits_while_the_pause_file_exists(tmp_path):
    import threading

    from rudder.agent.eval import wait_while

    f = tmp_path / "quiet"
    f.touch()
    threading.Timer(0.3, f.unlink).start()
    assert wait_while(f, poll_s=0.02) >= 0.25
    assert wait_while(f) < 0.01 and wait_while(None) == 0.0


def test_default_sets_read_together():
    from rudder.agent.eval import DEFAULT_SETS, FROM_RUNS

    both = load_windows(DEFAULT_SETS)
    assert len(both) == len(load_windows(STARTER)) + (len(load_windows(FROM_RUNS)) if FROM_RUNS.exists() else 0)


def test_packaged_windows_from_runs_are_balanced_named_and_confirmed():
    """The curated windows of replayed runs: both labels in equal numbers (per split too), each
    naming its source run and window, each label confirmed by the counterfactual replay."""
    from collections import Counter

    from rudder.agent.eval import FROM_RUNS

    recs = load_windows(FROM_RUNS)
    assert len(recs) >= 16
    by = Counter((r["split"], r["label_replace"]) for r in recs)
    for split in ("tune", "held-out"):
        assert by[(split, True)] == by[(split, False)] > 0, by
    for r in recs:
        run, rank, wid = r["source"].split(":")
        assert run.startswith("sim-synth-medium-") and rank.startswith("r") and wid == f"w{r['window']['window']}"
        assert r["agrees"] is True and r["hindsight"]["label"] == r["label_replace"]
        assert r["context"]["capacity"] > 0 and r["context"]["halo_nodes"] > 0
