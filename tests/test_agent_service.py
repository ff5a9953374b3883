"""AgentService: the real model server (rudder.agent.server) with SmolLM2 on 127.0.0.1, decisions over HTTP under
the schema, the per-machine entry point, and shutdown by pid."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rudder.agent.context import ContextBuilder, Prompt
from rudder.agent.decision import DecisionMaker, HttpBackend
from rudder.agent.messages import Answer, answer_schema
from rudder.agent.models import resolve
from llm_threads import LLM_THREADS  # tests/llm_threads.py
from rudder.agent.service import AgentService, free_port

SHORT = [{"role": "system", "content": "You decide whether to refresh a cache. Answer in JSON."},
         {"role": "user", "content": "Hit rate fell from 45% to 22%; 70% of slots are stale. Replace now?"}]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); it is gone once reaped
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    log = tmp_path_factory.mktemp("svc") / "server.log"
    svc = AgentService(resolve("smollm2-135m"), host="127.0.0.1", threads=1, threads_batch=LLM_THREADS,
                       ready_timeout_s=180,
                       log_path=log, model_alias="smollm2-135m")
    svc.start()
    yield svc
    pid = svc.proc.pid if svc.proc else None
    svc.stop()
    if pid:
        assert _gone(pid)


@pytest.mark.slow  # serves SmolLM2
@pytest.mark.parametrize("reason_first", [True, False])
def test_http_decision_through_real_server(service, reason_first):
    m = DecisionMaker(HttpBackend(service.url, model="smollm2-135m"), "smollm2-135m", timeout_s=300)
    d = m.decide(Prompt(SHORT, answer_schema(reason_first), "short", "short"))
    assert d.fallback is None, d.reason
    Answer.model_validate_json(d.raw)
    assert list(json.loads(d.raw))[0] == ("reason" if reason_first else "replace")
    assert d.backend == "http"


@pytest.mark.slow  # serves SmolLM2
def test_policy_uses_node_service_from_env(service, monkeypatch):
    from rudder.agent.policy import AgentPolicy
    from rudder.config import AgentConfig, PrefetchConfig
    from rudder.prefetch.policy import RunContext, StepInfo

    monkeypatch.setenv("RUDDER_AGENT_URL", service.url)
    ctx = RunContext(rank=0, num_trainers=1, part_id=0, num_parts=2, num_nodes=1000, partition_nodes=500,
                     halo_nodes=200, capacity=100, batch_size=10, fanouts=[5], steps_per_epoch=20, epochs=1,
                     feat_dim=4, feat_bytes=16, window=5, lookahead=0)
    pol = AgentPolicy(PrefetchConfig(policy="agent", window=5),
                      agent=AgentConfig(prompt="zero-shot", timeout_s=300, history=0))
    pol.setup(ctx)
    w = {"window": 0, "first_step": 0, "last_step": 4, "minibatches": 5, "hit_rate": 0.2, "remote_rows": 500,
         "fetched_rows": 400, "replaced_rows": 0, "buffer_fill": 100, "stale_slots": 60,
         "lookahead_missing": 0, "lookahead_rows": 0}
    pol.observe({"global_step": 4}, w)
    deadline = time.monotonic() + 300
    step, r = 5, None
    while time.monotonic() < deadline:
        r = pol.plan(StepInfo(epoch=0, step=step, global_step=step, remaining_steps=20 - step))
        if pol.history():
            break
        time.sleep(0.05)
    pol.close()
    recs = pol.decisions()
    assert len(recs) == 1 and recs[0]["backend"] == "http" and recs[0]["fallback"] is None, recs
    assert recs[0]["staleness"] >= 1
    if recs[0]["replace"]:
        assert r is not None and r.mechanism == "massivegnn" and r.source == "agent#1"


@pytest.mark.slow  # serves SmolLM2
def test_service_entry_point_ready_and_stops_on_sigterm(tmp_path):
    port = free_port()
    ready = tmp_path / "ready" / "service0.0"
    env = dict(os.environ, RUDDER_MACHINE_ADDR="127.0.0.1", RUDDER_READY_FILE=str(ready))
    proc = subprocess.Popen([sys.executable, "-m", "rudder.agent.service", "--model", "smollm2-135m",
                             "--port", str(port), "--no-warm", "--ready-timeout", "180",
                             "--path", str(resolve("smollm2-135m"))],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == f"READY http://127.0.0.1:{port}", line
        assert ready.read_text().strip() == f"http://127.0.0.1:{port}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        # the server it started is gone with it: nothing listens on the port any more
        import socket

        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# What bounds how often the agent can decide in a run is the server's time per answer, most of
# it reading the prompt; these two catch the regressions that made it slower (BENCHMARKS §5).
def test_server_skips_logits_of_prompt_tokens():
    """llama_cpp.server's default (logits_all=true) projects every prompt token onto the whole
    vocabulary and copies the result: nothing the agent reads, ~40% of each answer's time."""
    argv = AgentService("m.gguf", server="llama_cpp").argv()
    assert argv[argv.index("--logits_all") + 1] == "false"
    argv = AgentService("m.gguf", logits_all=True, server="llama_cpp").argv()
    assert argv[argv.index("--logits_all") + 1] == "true"


def test_service_runs_rudders_choice_server_by_default():
    """The default server samples only the answer's choices (rudder.agent.server); the tested
    flags keep their meaning: threads, the batch, the prompt-state cache."""
    argv = AgentService("m.gguf", threads=1, threads_batch=2, n_batch=64, cache_mb=256).argv()
    assert argv[1:3] == ["-m", "rudder.agent.server"]
    for flag, val in (("--threads", "1"), ("--threads-batch", "2"), ("--n-batch", "64"),
                      ("--cache-mb", "256"), ("--n-ctx", "4096")):
        assert argv[argv.index(flag) + 1] == val
    with pytest.raises(ValueError, match="agent server"):
        AgentService("m.gguf", server="vllm")


@pytest.mark.slow  # serves SmolLM2
def test_server_reads_only_the_new_part_of_each_trainers_prompt(service):
    """Trainers of two ranks take turns on one server: after the warm-up, each prompt's system
    text and canned examples come from the server's KV cache; it reads only the rest."""
    import re

    from rudder.agent.prompt_texts import CANNED, CANNED_CONTEXT
    from rudder.agent.decision import warm_prompt

    m = DecisionMaker(HttpBackend(service.url, model="smollm2-135m"), "smollm2-135m", timeout_s=300)
    pos = service.log_path.stat().st_size
    m.warm(warm_prompt())
    for rank in (0, 1, 0):
        ctx = {**CANNED_CONTEXT, "rank": rank, "part_id": rank}
        w = {**CANNED[1]["window"], "window": 7 + rank}
        m.decide(ContextBuilder(ctx).build(w, [], CANNED[1]["recent"]))
    time.sleep(0.5)  # the server logs its timings after answering
    text = service.log_path.read_bytes()[pos:].decode(errors="replace")
    hits = [(int(a), int(b)) for a, b in
            re.findall(r"(\d+) prefix-match hit, remaining (\d+) prompt tokens", text)]
    assert len(hits) >= 3, text[-3000:]
    for cached, read in hits[-3:]:
        assert cached > 4 * read, hits  # the constant prefix is most of every prompt


def test_service_refuses_wildcard_and_reports_early_exit(tmp_path):
    with pytest.raises(ValueError, match="not all"):
        AgentService("x.gguf", host="0.0.0.0")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    svc = AgentService(bad, host="127.0.0.1", ready_timeout_s=120, log_path=tmp_path / "log")
    from rudder.agent.service import AgentServiceError

    with pytest.raises(AgentServiceError, match="exited with code"):
        svc.start()
    assert svc.proc is None
