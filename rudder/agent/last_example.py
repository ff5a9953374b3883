"""`agent.backend: last-example`: a control decider that answers every prompt with its last
example's answer, verbatim; no model runs (issue 18, BENCHMARKS 7t).

Why: the small models that run here mostly answer what their prompt's last example answered (7t: with
judge-history-3, whose last example is the held-out pool's window nearest to the asked one, every
model's answer was that window's at every window scored). This backend is that behaviour with the
model taken out: with judge-history-3 it is a 1-nearest-neighbour lookup in the pool; with a prompt
of fixed examples it gives one answer at every window. It runs through the agent's whole path (its
thread, its prompt and the past counterfactual the prompt reads, validation, the regime that
applies the answer), in a replay (`rudder sim`) or a live run, so what an LLM adds over copying
is measured side by side.
"""
from __future__ import annotations

from rudder.agent.decision import BackendError, Completion


def last_answer(messages: list[dict]) -> str | None:
    """The text of the last example answer (assistant message) in a prompt's messages, or None."""
    answers = [m["content"] for m in messages if m.get("role") == "assistant"]
    return answers[-1] if answers else None


class LastExampleBackend:
    name = "last-example"

    def complete(self, messages: list[dict], schema: dict, max_tokens: int, timeout_s: float,
                 cancel=None) -> Completion:
        answer = last_answer(messages)
        if answer is None:
            raise BackendError("no-example", "agent.backend=last-example: the prompt has no example answer to "
                                             "copy (a prompt variant without examples)")
        return Completion(answer, "stop")

    def close(self) -> None:
        pass
