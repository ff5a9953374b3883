"""Rudder's agent: an LLM decides when the halo buffer replaces, asynchronously.

models.py    registry of GGUF models (shipped in PyPI packages, assembled from parts, or user paths)
messages.py  typed messages: Answer (the schema the model must fill), Decision, HistoryEntry
context.py   ContextBuilder: static context + window + history -> chat messages (prompt variants)
decision.py  DecisionMaker: inproc (llama_cpp) or http (OpenAI-compatible) backend, validated
             answers, fallbacks for bad/truncated/late ones
script.py, last_example.py  backends with no model: a run's recorded answers; each prompt's last
             example's answer (a control: what the small models do, BENCHMARKS 7t)
service.py   AgentService: one model server per node (rudder.agent.server, or llama_cpp.server),
             shared by its trainers
steering.py  the one steering skeleton (windows, regime, apply, judge) with a pluggable Decider
windows.py   WindowStats / DecisionPoint: what a decider sees at a window close
policy.py    AgentPolicy: the "agent" prefetch policy (LLMDecider: agent thread, queues, history)
trajectories.py, classifiers.py  the random collector and the classifier deciders
rule.py      RulePolicy: the hand-written adaptive rule (decider)
eval.py      offline scoring on labelled windows; labelling windows of finished runs
cli.py       `rudder agent models|eval|label|serve|decide|judge`

Importing this package imports nothing heavy; llama_cpp loads only when a model does.
"""
