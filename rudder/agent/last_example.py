"""`agent.backend: last-example`: a control decider that answers every prompt with its last
example's answer, verbatim; no model runs (issue 18, BENCHMARKS 7t).

Why: the small models that run here answer what their prompt's last example answered (7t: with
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


class LastExampleBackend:
    name = "last-example"

    def complete(self, messages: list[dict], schema: dict, max_tokens: int, timeout_s: float,
                 cancel=None) -> Completion:
        answers = [m["content"] for m in messages if m.get("role") == "assistant"]
        if not answers:
            raise BackendError("no-example", "agent.backend=last-example: the prompt has no example answer to "
                                             "copy (a prompt variant without examples)")
        return Completion(answers[-1], "stop")

    def close(self) -> None:
        pass
