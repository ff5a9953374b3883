"""`agent.backend: script`: the answers a decider recorded, given back window by window with no
model running. The recorded decisions are a run's decisions-r<R>.jsonl (a live run's, or those of
`rudder sim`'s replay of one, where the LLM answered every window with training paused); each
trainer reads its own rank's file and answers window k with the recorded window k's answer,
through the agent's own path (its thread, its prompt and the past counterfactual the prompt
reads, validation of the answer's JSON, the regime that applies it).

Why (issue 18, must-have 6): on a host without cores to spare the agent's model shares the
trainers' cores, so a live agent run's epoch time is its model's CPU cost, not its decisions'
worth. A scripted run measures the decisions live without that cost (the model's CPU is measured
apart, by the agent's own run).

Windows are matched by number, not by content: DistDGL samples a fresh stream each run, so the
live window k holds other minibatches than the recorded run's window k, drawn the same way. A
window the recorder answered with a fallback falls back here too; one it never answered (dropped,
or past the end of a shorter run) falls back with that reason.
"""
from __future__ import annotations

import json
from pathlib import Path

from rudder.agent.context import Prompt
from rudder.agent.decision import BackendError, Completion, DecisionMaker
from rudder.agent.messages import Decision
from rudder.records import read_jsonl_strict


def answers_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"decisions-r{rank}.jsonl"


def load_answers(directory: str | Path, rank: int) -> dict[int, dict]:
    """window -> the recorded decision answering it (the first answer per window; dropped windows,
    recorded with negative decision numbers and no answer, are left out)."""
    path = answers_file(directory, rank)
    if not path.is_file():
        raise FileNotFoundError(f"agent.script: no recorded answers for rank {rank}: {path} does not exist "
                                f"(agent.script names a run directory, or `rudder sim`'s replay of one)")
    out: dict[int, dict] = {}
    try:
        records = read_jsonl_strict(path, "a JSON decision record")
    except ValueError as exc:
        raise ValueError(f"agent.script: {exc}") from None
    for _, rec in records:
        if rec.get("window") is None or int(rec.get("decision") or 0) < 0:
            continue
        out.setdefault(int(rec["window"]), rec)
    return out


class ScriptBackend:
    """Holds one rank's recorded answers; ScriptedMaker answers from them by window."""

    name = "script"

    def __init__(self, answers: dict[int, dict]):
        self.answers = answers

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None) -> Completion:
        raise BackendError("script", "a script answers by window: ScriptedMaker.decide")

    def close(self) -> None:
        pass


class ScriptedMaker(DecisionMaker):
    """A DecisionMaker whose answers are the recorded ones: the recorded raw answer is validated
    as the model's text is, so the Decision is the one the recorder took."""

    @classmethod
    def from_dir(cls, directory: str | Path, rank: int, fallback: str = "static") -> "ScriptedMaker":
        answers = load_answers(directory, rank)
        models = sorted({str(r.get("model")) for r in answers.values() if r.get("model")})
        label = "script:" + ("+".join(models) or "none")
        return cls(ScriptBackend(answers), label, fallback)

    def decide(self, prompt: Prompt, cancel=None) -> Decision:
        rec = self.backend.answers.get(prompt.window) if prompt.window is not None else None
        if rec is None:
            return self._fallback(f"no recorded answer for window {prompt.window}", "", 0.0, prompt)
        raw = str(rec.get("raw") or "")
        if rec.get("fallback"):
            why = str(rec.get("reason") or "").removeprefix("fallback: ")
            return self._fallback(f"recorded fallback: {why}", raw, 0.0, prompt)
        return self.validate(Completion(raw, "stop"), 0.0, prompt)

    def warm(self, prompt: Prompt) -> float:
        return 0.0
