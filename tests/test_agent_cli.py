"""`rudder agent` on bad input: one error line naming the bad value, exit code 2, before any
model is loaded or any window scored (and no output file touched)."""
import json
import socket
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from rudder.agent.eval import STARTER
from rudder.cli import main
from test_agent_eval import OkHandler  # tests/test_agent_eval.py: a fake OpenAI-compatible server


@pytest.fixture()
def ok_url():
    """A server that answers, so the old code would score instead of failing (no model loads)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), OkHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture()
def dead_url():
    """A port nothing listens on (bound, then closed: connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture()
def windows(tmp_path):
    w = tmp_path / "w1.jsonl"
    w.write_text("".join(STARTER.read_text().splitlines(keepends=True)[:3]))
    return w


def fails(capsys, argv, *needles):
    """main(argv) exits 2 with one line naming each needle, and printed no table."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's type checks
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "accuracy" not in out, (out, err)
    for n in needles:
        assert n in line, line
    return line


def test_label_names_a_missing_or_non_run_directory_and_keeps_the_output(tmp_path, capsys):
    keep = tmp_path / "keep.jsonl"
    keep.write_text("old\n")
    fails(capsys, ["agent", "label", str(tmp_path / "typo"), "-o", str(keep)], "no run directory at", "typo")
    fails(capsys, ["agent", "label", str(tmp_path), "-o", str(keep)], "no run.json in", str(tmp_path))
    assert keep.read_text() == "old\n"
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    fails(capsys, ["agent", "label", str(run), "-o", str(tmp_path)], "-o", "is a directory")


@pytest.mark.parametrize("url, needle", [("notaurl", "not an http(s)://host[:port] address"),
                                         ("http://:80", "not an http(s)://host[:port] address"),
                                         ("http://h:99999", "port")])
def test_a_malformed_url_is_named(capsys, windows, url, needle):
    fails(capsys, ["agent", "eval", "--url", url, "--windows", str(windows)], url, needle)
    fails(capsys, ["agent", "decide", "--url", url, "--window", '{"hit_rate": 0.3}'], url, needle)


def test_an_unreachable_server_is_named_not_scored(capsys, windows, dead_url):
    fails(capsys, ["agent", "eval", "--url", dead_url, "--windows", str(windows)], dead_url, "no usable server")
    fails(capsys, ["agent", "decide", "--url", dead_url, "--window", '{"hit_rate": 0.3}'], dead_url)
    # a run's agent still warms up without dying when its server is down (it falls back)
    from rudder.agent.decision import DecisionMaker, HttpBackend, warm_prompt

    assert DecisionMaker(HttpBackend(dead_url), "m", timeout_s=2).warm(warm_prompt()) < 2


def test_eval_windows_missing_empty_or_a_directory(tmp_path, capsys, ok_url, windows):
    base = ["agent", "eval", "--url", ok_url, "--quiet"]
    typo = str(tmp_path / "typo.jsonl")
    fails(capsys, base + ["--windows", str(windows), "--windows", typo], typo)
    (tmp_path / "empty.jsonl").write_text("")
    fails(capsys, base + ["--windows", str(tmp_path / "empty.jsonl")], "no labelled windows in", "empty.jsonl")
    fails(capsys, ["agent", "eval", "--windows", str(tmp_path)], str(tmp_path), "is a directory")


@pytest.mark.parametrize("option, value", [("--limit", "0"), ("--limit", "-1"), ("--timeout", "-1"),
                                           ("--timeout", "0"), ("--threads", "-1"), ("--threads", "0")])
def test_eval_rejects_numbers_below_one(capsys, ok_url, windows, option, value):
    fails(capsys, ["agent", "eval", "--url", ok_url, "--quiet", "--windows", str(windows), option, value],
          option, value, "must be above 0")


def test_eval_json_path_is_checked_before_scoring(tmp_path, capsys, ok_url, windows):
    base = ["agent", "eval", "--url", ok_url, "--windows", str(windows), "--json"]
    fails(capsys, base + [str(tmp_path / "nodir" / "x.json")], "--json", "no directory")
    fails(capsys, base + [str(tmp_path)], "--json", "is a directory")
    if Path("/proc/self").is_dir():  # a directory that takes no new file
        fails(capsys, base + ["/proc/x.json"], "--json /proc/x.json", "cannot write")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("args, needle", [(["--window", "[1, 2]"], "--window [1, 2]: not a JSON object"),
                                          (["--context", "[1]"], "--context [1]: not a JSON object"),
                                          (["--history", '{"a": 1}'], '--history {"a": 1}: not a JSON list'),
                                          (["--window", "{oops"], "--window {oops: not JSON")])
def test_decide_names_the_option_that_is_not_the_json_it_needs(capsys, args, needle):
    argv = ["agent", "decide", "--window", '{"hit_rate": 0.3}'] + args
    fails(capsys, argv, needle)


def test_decide_window_file_missing_or_a_directory(tmp_path, capsys):
    fails(capsys, ["agent", "decide", "--window", str(tmp_path)], "--window", "a directory")
    fails(capsys, ["agent", "decide", "--window", str(tmp_path / "w.json")], "--window", "neither inline JSON")
    (tmp_path / "w.json").write_text(json.dumps({"hit_rate": 0.3}))
    (tmp_path / "c.json").write_text("[1]")
    fails(capsys, ["agent", "decide", "--window", str(tmp_path / "w.json"), "--context", str(tmp_path / "c.json")],
          "--context", "not a JSON object")
