"""Threads for a model a test loads in its own process (SmolLM2 through llama.cpp).

The agent's default is 1 thread (a trainer owns the node's other cores), but a test that only
asks a model for answers has the host to itself: 2 threads read a 2.9k-token prompt in 21 s
instead of 32 s on the 2-core CI host, with the same answer (each dot product is summed the same
way whatever the thread count). The agent-server tests read prompts with these threads
(threads_batch) but generate with 1, as a run does; tests of deadlines keep their own settings.
"""
from __future__ import annotations

import os

LLM_THREADS = min(2, os.cpu_count() or 1)
