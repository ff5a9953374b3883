"""What the steering policies share (agent, classifier, collector, and hindsight's replay of
their records): a decision, once applied, sets a *regime* that holds until the next one.

  replace, lookahead mechanism   a lookahead round on every minibatch until the next decision
  replace, massivegnn mechanism  one MassiveGNN round when the decision applies (a round swaps
                                 every stale slot at once: repeating it would only churn)
  keep (or a fallback)           no round until the next decision
"""
from __future__ import annotations

from rudder.prefetch.policy import Replace


class Regime:
    """The standing plan between two decisions."""

    def __init__(self) -> None:
        self.standing: Replace | None = None

    def apply(self, replace: Replace | None) -> Replace | None:
        """A new decision takes over: `replace` (its round) or None (keep). Returns the plan
        for the minibatch it applies at; later minibatches get `standing`."""
        self.standing = replace if replace is not None and replace.mechanism == "lookahead" else None
        return replace

    def end(self) -> None:
        self.standing = None
