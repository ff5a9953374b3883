"""Rudder: persistent halo-feature buffer for DistDGL, steered by policies (static, fixed,
lookahead, an LLM agent, classifiers), with a Parsl workflow and a DuckDB results store."""
import os

# dgl reads DGLBACKEND at import; set it before anything imports dgl (avoids ~/.dgl writes).
os.environ.setdefault("DGLBACKEND", "pytorch")

__version__ = "0.1.0"
