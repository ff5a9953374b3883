"""The policy registry: one class per policy, chosen by name from config.

none       no buffer: plain DistDGL, every remote row pulled every time
static     buffer filled once (init), never replaced
fixed      MassiveGNN: a replacement round every `period` minibatches (stale slots <- most missed)
lookahead  Belady's rule on the minibatches sampled ahead, every minibatch, under a row budget
           (admits this minibatch's misses only, or with admit=any also rows ahead of use)
agent      an LLM decides when and how much (rudder.agent)          [registered lazily]
classifier:<name>  an offline-trained classifier decides when (rudder.agent.classifiers)
collect[:k]  random replace/skip every k-th window; writes trajectories for the classifiers
rule       a hand-written adaptive rule decides when and how to admit (rudder.agent.rule)
"""
from __future__ import annotations

import importlib
from typing import Callable

from rudder.config import LOOKAHEAD_POLICIES, POLICY_NAMES, PrefetchConfig, check_policy_name  # noqa: F401 (re-exported)
from rudder.prefetch.policy import Policy, Replace, RunContext, StepInfo, budget_rows, stale_after


class NoBufferPolicy(Policy):
    name = "none"
    uses_buffer = False


class StaticPolicy(Policy):
    name = "static"


class FixedPeriodPolicy(Policy):
    """MassiveGNN: replace every `period` minibatches. The reference does not count misses on a
    minibatch in which it replaces; the mechanism honours that (HaloBuffer.record).
    evict (prefetch.evict): which slots its rounds count stale (`half`: not hit for period/2)."""

    name = "fixed"
    knobs = ("period", "alpha", "evict")

    def __init__(self, cfg: PrefetchConfig):
        self.period = cfg.period
        self.stale_after = stale_after(cfg.evict, cfg.period)

    def plan(self, step: StepInfo) -> Replace | None:
        if step.global_step > 0 and step.global_step % self.period == 0:
            return Replace("massivegnn", None, self.name, stale_after=self.stale_after)
        return None


class LookaheadPolicy(Policy):
    """Every minibatch, Belady's rule over the `lookahead` minibatches already sampled, with at
    most `budget` × capacity slots changed per round."""

    name = "lookahead"
    knobs = ("lookahead", "budget", "admit")

    def __init__(self, cfg: PrefetchConfig):
        self.budget = cfg.budget
        self.admit = cfg.admit

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.max_rows = budget_rows(self.budget, ctx.capacity)

    def plan(self, step: StepInfo) -> Replace | None:
        return Replace("lookahead", self.max_rows, self.name, self.admit)


def _lazy(module: str, attr: str) -> Callable[[PrefetchConfig, dict], Policy]:
    def make(cfg: PrefetchConfig, extra: dict) -> Policy:
        return getattr(importlib.import_module(module), attr)(cfg, **extra)

    make.target = (module, attr)  # type: ignore[attr-defined]  (policy_class imports it)
    return make


# name -> factory(cfg, extra_kwargs). Lazy entries keep llama.cpp/sklearn out of plain runs.
REGISTRY: dict[str, Callable[[PrefetchConfig, dict], Policy]] = {
    "none": lambda cfg, extra: NoBufferPolicy(),
    "static": lambda cfg, extra: StaticPolicy(),
    "fixed": lambda cfg, extra: FixedPeriodPolicy(cfg),
    "lookahead": lambda cfg, extra: LookaheadPolicy(cfg),
    "agent": _lazy("rudder.agent.policy", "AgentPolicy"),
    "classifier": _lazy("rudder.agent.classifiers", "ClassifierPolicy"),
    "collect": _lazy("rudder.agent.trajectories", "TrajectoryPolicy"),
    "rule": _lazy("rudder.agent.rule", "RulePolicy"),
}


_EAGER: dict[str, type[Policy]] = {"none": NoBufferPolicy, "static": StaticPolicy,
                                   "fixed": FixedPeriodPolicy, "lookahead": LookaheadPolicy}


def policy_class(name: str) -> type[Policy]:
    """The class a policy name makes (a lazy one is imported): its knobs, its flags."""
    check_policy_name(name if name != "classifier" else "classifier:_")
    base = name.split(":", 1)[0]
    if base in _EAGER:
        return _EAGER[base]
    module, attr = REGISTRY[base].target  # type: ignore[attr-defined]
    return getattr(importlib.import_module(module), attr)


def policy_extras(run_cfg) -> dict:
    """A run config's extras for make_policy: the agent's config, and policy `rule`'s knobs
    (the `rule:` section) when the run's policy is `rule`."""
    extra = {"agent": run_cfg.agent}
    if run_cfg.prefetch.policy.split(":", 1)[0] == "rule":
        extra.update(run_cfg.rule.model_dump())
    return extra


def make_policy(cfg: PrefetchConfig, **extra) -> Policy:
    """extra: e.g. agent=AgentConfig for the agent policy, or classifier model name."""
    check_policy_name(cfg.policy)
    base, _, arg = cfg.policy.partition(":")
    if arg:
        extra = {**extra, "model_name": arg}
    return REGISTRY[base](cfg, extra)
