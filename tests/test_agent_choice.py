"""Choice decoding (rudder.agent.choice): the template a schema compiles to accepts exactly the
answers the schema does, and the real SmolLM2 decoded through it answers validly and as the
grammar path does."""
import itertools
import json

import jsonschema
import numpy as np
import pytest

from rudder.agent.choice import template
from rudder.agent.messages import Answer, answer_schema
from llm_threads import LLM_THREADS  # tests/llm_threads.py

TEMPLATED = [dict(evidence_reason=True), dict(evidence_reason=True, measured=False),
             dict(reason_first=False, evidence_reason=True),
             dict(reason_first=False, evidence_reason=True, measured=False)]


@pytest.mark.parametrize("kw", TEMPLATED)
def test_template_samples_are_answers_under_the_schema(kw):
    schema = answer_schema(**kw)
    tpl = template(schema)
    assert tpl is not None
    validator = jsonschema.Draft202012Validator(schema)
    rng = np.random.default_rng(0)
    seen: dict[str, set] = {}
    for _ in range(200):
        text = tpl.sample(rng)
        data = json.loads(text)
        validator.validate(data)
        Answer.model_validate_json(text)
        assert text == json.dumps(data)  # the canonical form the examples show the model
        for k, v in data.items():
            seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    # every field of the schema is produced, each enum in all its values
    props = schema["anyOf"][0]["properties"]
    assert set(seen) == set(props)
    assert len(seen["budget"]) == len(props["budget"]["enum"])
    assert seen["replace"] == {"true", "false"}


@pytest.mark.parametrize("kw", TEMPLATED)
def test_every_answer_the_schema_accepts_the_template_accepts(kw):
    """All the schema's answers (every trend word, a few levels, every lookahead form, every
    budget and direction) match the template; near misses match neither."""
    schema = answer_schema(**kw)
    tpl = template(schema)
    validator = jsonschema.Draft202012Validator(schema)
    measured = kw.get("measured", True)
    trends = [""] + ([f"hit rate {w}, " for w in ("rising", "steady", "falling", "57%")]
                     if measured else [])
    looks = ["lookahead on", "lookahead off", "lookahead on, much missing ahead",
             "lookahead on, little missing ahead"]
    order = list(schema["anyOf"][0]["properties"])
    n = 0
    for trend, look, replace, budget, hr, rr in itertools.product(
            trends, looks, (True, False), ("small", "medium", "large"), ("up", "down", "flat"),
            ("up", "down", "flat")):
        ans = {"reason": f"{trend}{look}: {'replace' if replace else 'keep'}", "replace": replace,
               "budget": budget, "expected": {"hit_rate": hr, "remote_rows": rr}}
        text = json.dumps({k: ans[k] for k in order})
        assert validator.is_valid(json.loads(text)) and tpl.matches(text), text
        n += 1
        if n % 97 == 0:  # near misses: rejected by both
            for bad in (text.replace(": replace\"", ": keep\"") if replace else text.replace(": keep\"", ": replace\""),
                        text.replace(budget, "huge"), text.replace("lookahead", "look ahead")):
                assert not tpl.matches(bad) and not validator.is_valid(json.loads(bad))


def test_free_text_schemas_keep_the_grammar_path():
    assert template(answer_schema()) is None  # free reason text
    assert template(answer_schema(admission=True)) is None  # the judge variant's free reason
    assert template({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
                     "additionalProperties": False}) is None


@pytest.fixture(scope="module")
def smollm():
    from llama_cpp import Llama

    from rudder.agent.choice import ChoiceDecoder
    from rudder.agent.models import resolve

    llm = Llama(model_path=str(resolve("smollm2-135m")), n_ctx=4096, n_threads=LLM_THREADS,
                n_threads_batch=LLM_THREADS, seed=0, verbose=False)
    yield llm, ChoiceDecoder(llm)
    llm.close()


def _eval_prompts(n: int):
    from rudder.agent.context import ContextBuilder
    from rudder.agent.eval import STARTER, load_windows

    recs = load_windows(STARTER)
    picks = [recs[i] for i in np.linspace(0, len(recs) - 1, n).astype(int)]
    return [ContextBuilder(r["context"]).build(r["window"], r.get("history") or [], r.get("recent") or [])
            for r in picks]


@pytest.mark.slow  # SmolLM2 answers 4 prompts twice
def test_choice_answers_agree_with_the_grammar_path(smollm):
    llm, dec = smollm
    for prompt in _eval_prompts(4):
        tpl = template(prompt.schema)
        text, finish, st = dec.complete(prompt.messages, tpl)
        assert finish == "stop"
        ans = Answer.model_validate_json(text)
        assert st["choices"] <= 16 < st["generated_tokens"]  # most of the answer was forced
        g = llm.create_chat_completion(messages=prompt.messages, max_tokens=160, temperature=0.0,
                                       response_format={"type": "json_object", "schema": prompt.schema})
        assert Answer.model_validate_json(g["choices"][0]["message"]["content"]) == ans


@pytest.mark.slow  # SmolLM2
def test_choice_decoder_stops_on_cancel_deadline_and_length(smollm):
    import threading
    import time

    _, dec = smollm
    prompt = _eval_prompts(1)[0]
    tpl = template(prompt.schema)
    cancel = threading.Event()
    cancel.set()
    assert dec.complete(prompt.messages, tpl, cancel=cancel)[1] == "cancelled"
    assert dec.complete(prompt.messages, tpl, deadline=time.monotonic() - 1)[1] == "timeout"
    text, finish, _ = dec.complete(prompt.messages, tpl, max_tokens=5)
    assert finish == "length"
    with pytest.raises(ValueError):
        Answer.model_validate_json(text)


@pytest.mark.slow  # SmolLM2 in process
def test_inproc_backend_decides_through_the_choice_decoder():
    from rudder.agent.decision import DecisionMaker, InprocBackend
    from rudder.agent.models import resolve

    backend = InprocBackend(resolve("smollm2-135m"))
    try:
        maker = DecisionMaker(backend, "smollm2-135m", timeout_s=300)
        d = maker.decide(_eval_prompts(1)[0])
        assert d.fallback is None, d.reason
        assert backend._choice  # the default variant's schema went through the template
        Answer.model_validate_json(d.raw)
    finally:
        backend.close()
