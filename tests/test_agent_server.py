"""rudder.agent.server, the node's model server: it answers the trainers' HttpBackend (choice
decoding for the default variant's schema, the grammar for free text), a late or cancelled
question ends as before and the server answers the next one, and each trainer resumes from its
own kept prompt state."""
import dataclasses
import json
import threading
import time
import urllib.request

import numpy as np
import pytest

from rudder.agent.context import ContextBuilder
from rudder.agent.prompt_texts import CANNED, CANNED_CONTEXT
from rudder.agent.decision import BackendError, DecisionMaker, HttpBackend
from rudder.agent.messages import Answer
from rudder.agent.models import resolve
from rudder.agent.server import StateCache, schema_of
from llm_threads import LLM_THREADS  # tests/llm_threads.py
from rudder.agent.service import AgentService


def test_state_cache_keeps_the_longest_prefix_and_evicts_the_oldest():
    c = StateCache(max_bytes=10)
    a, b = np.array([1, 2, 3, 4]), np.array([1, 2, 9])
    c.put(a, b"xxxx")
    c.put(b, b"yyyy")
    assert c.best(np.array([1, 2, 3, 4, 5]))[1] == 4
    assert c.states[c.best(np.array([1, 2, 9, 9]))[0]][1] == b"yyyy"
    c.put(np.array([1, 2, 3, 4, 5, 6]), b"zzzz")  # supersedes a (its prefix), then b is the oldest
    assert len(c.states) == 2 and c.size() <= 10
    c.put(np.array([7]), b"w" * 11)  # larger than the whole cache: not kept
    assert c.best(np.array([7]))[0] is None
    assert schema_of({"type": "json_schema", "json_schema": {"schema": {"a": 1}}}) == {"a": 1}
    assert schema_of({"type": "json_object", "schema": {"a": 1}}) == {"a": 1}
    assert schema_of(None) is None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("srv") / "server.log"
    svc = AgentService(resolve("smollm2-135m"), host="127.0.0.1", threads=1, threads_batch=LLM_THREADS,
                       ready_timeout_s=180,
                       log_path=log, model_alias="smollm2-135m", cache_mb=256)  # 3 states of ~2.5k tokens (~23 kB each)
    svc.start()
    yield svc
    svc.stop()


def _prompt(rank: int, window: int = 7):
    ctx = {**CANNED_CONTEXT, "rank": rank, "part_id": rank}
    return ContextBuilder(ctx).build({**CANNED[1]["window"], "window": window}, [], CANNED[1]["recent"])


def _uncached(prompt, tag: str):
    """The prompt with a first line no kept state shares: the server reads all of its ~2.5k
    tokens (seconds here), so a 0.3 s deadline ends it late on any CPU (a cached prefix leaves
    ~100 tokens and 8 choices, a few tenths of a second: too close to the deadline)."""
    first = {**prompt.messages[0], "content": f"{tag}\n{prompt.messages[0]['content']}"}
    return dataclasses.replace(prompt, messages=[first, *prompt.messages[1:]])


def _post(url: str, prompt, max_tokens: int = 160) -> dict:
    body = json.dumps({"messages": prompt.messages, "max_tokens": max_tokens,
                       "response_format": {"type": "json_object", "schema": prompt.schema}}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


@pytest.mark.slow  # serves SmolLM2
def test_server_answers_by_choices_and_resumes_each_trainers_state(server):
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "smollm2-135m"
    out = [_post(server.url, _prompt(r)) for r in (0, 1)]
    for o in out:
        assert o["choices"][0]["finish_reason"] == "stop"
        Answer.model_validate_json(o["choices"][0]["message"]["content"])
        assert o["timings"]["decoder"] == "choice"
    # rank 0 asks again with the same question: its kept state holds all of it, although rank
    # 1's question overwrote the KV cache in between
    again = _post(server.url, _prompt(0))
    assert again["timings"]["read_tokens"] <= 1, again["timings"]
    assert again["choices"][0]["message"] == out[0]["choices"][0]["message"]


@pytest.mark.slow  # serves SmolLM2
def test_late_and_cancelled_questions_end_as_before_and_the_server_goes_on(server):
    maker = DecisionMaker(HttpBackend(server.url, model="smollm2-135m"), "smollm2-135m", timeout_s=0.3)
    d = maker.decide(_uncached(_prompt(0, window=11), "Late question."))
    assert d.fallback is not None and d.reason.startswith("fallback: late: timeout")
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(BackendError) as exc:
        HttpBackend(server.url).complete(_uncached(_prompt(1, window=12), "Cancelled question.").messages,
                                         _prompt(1).schema, 160, 300, cancel)
    assert exc.value.kind == "cancelled"
    t0 = time.monotonic()
    d = DecisionMaker(HttpBackend(server.url), "smollm2-135m", timeout_s=300).decide(_prompt(0, window=13))
    assert d.fallback is None, d.reason
    assert time.monotonic() - t0 < 120


@pytest.mark.slow  # serves SmolLM2
def test_a_trainers_next_question_reads_only_itself(server):
    """Issue 16, end to end: two trainers take turns on the server, each asking about three
    windows; each answer is measured as the model predicted (so its hindsight example repeats
    it) and kept with the exact question asked (HistoryEntry.asked). The `default` prompt then
    shows that question again as the run's own example where it stood, so the server resumes
    from the trainer's kept state and reads only the new question and at most the answer's tail
    (its words where the model's differ from the hindsight example's), not the example again."""
    import llama_cpp

    from rudder.agent.messages import HistoryEntry

    tok = llama_cpp.Llama(model_path=str(resolve("smollm2-135m")), vocab_only=True, verbose=False)
    builders = [ContextBuilder({**CANNED_CONTEXT, "lookahead": 0, "rank": r, "part_id": r}) for r in (0, 1)]
    windows = [{**CANNED[1]["window"], "window": 7 + i, "first_step": 70 + 10 * i, "last_step": 79 + 10 * i,
                "hit_rate": 0.41 + 0.02 * i} for i in range(3)]
    hist, checked = [[], []], []
    for i, w in enumerate(windows):
        prev = [windows[i - 1]["hit_rate"]] if i else [CANNED[1]["recent"][-1]]
        for r in (0, 1):
            p = builders[r].build(w, hist[r], prev)
            out = _post(server.url, p)
            a = Answer.model_validate_json(out["choices"][0]["message"]["content"])
            if i:  # the question (and the example before it) extend this trainer's last prompt
                final = len(tok.tokenize(p.messages[-1]["content"].encode(), add_bos=False))
                checked.append((out["timings"]["read_tokens"], final, len(p.messages)))
            hist[r].append(HistoryEntry(
                decision=i + 1, window=w["window"], replace=a.replace, budget=a.budget, rows=500,
                expected_hit_rate=a.expected.hit_rate, expected_remote_rows=a.expected.remote_rows,
                hit_delta=0.02 if a.replace else 0.0, rows_delta=-0.05 if a.replace else 0.0,
                outcome_hit_rate="up" if a.replace else "flat",
                outcome_remote_rows="down" if a.replace else "flat", correct=True,
                judged={**w, "prev_hit_rate": prev[-1]}, asked=p.asked))
    assert [n for _, _, n in checked] == [1 + 2 * 5 + 1] * 2 + [1 + 2 * 6 + 1] * 2  # 1, then 2 own examples
    for read, final, _ in checked:
        assert read <= final + 60, checked
