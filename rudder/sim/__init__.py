"""The trace simulator: replays, classic caches, the hindsight optimum (Belady), trace generation."""
