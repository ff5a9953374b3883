"""Rudder's agent: an LLM decides when the halo buffer replaces, asynchronously.

models.py    registry of GGUF models (shipped in PyPI packages, assembled from parts, or user paths)
messages.py  typed messages: Answer (the schema the model must fill), Decision, HistoryEntry
context.py   ContextBuilder: static context + window + history -> chat messages (prompt variants)
decision.py  DecisionMaker: inproc (llama_cpp) or http (OpenAI-compatible) backend, validated
             answers, fallbacks for bad/truncated/late ones
service.py   AgentService: one llama_cpp.server per node, shared by its trainers
policy.py    AgentPolicy: the "agent" prefetch policy (agent thread, queues, self-reflection)
eval.py      offline scoring on labelled windows; labelling windows of finished runs
cli.py       `rudder agent models|eval|label|serve|decide`

Importing this package imports nothing heavy; llama_cpp loads only when a model does.
"""
