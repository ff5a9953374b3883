"""Rudder: persistent halo-feature buffer for DistDGL, steered by policies (static, fixed,
lookahead, an LLM agent, classifiers), with a Parsl workflow and a DuckDB results store."""
import os
import warnings

# dgl reads DGLBACKEND at import; set it before anything imports dgl (avoids ~/.dgl writes).
os.environ.setdefault("DGLBACKEND", "pytorch")

__version__ = "0.1.0"

# dgl 2.1 imports torchdata.datapipes, which warns loudly on import in every process; it is
# pinned (torchdata 0.9.0) on purpose, so the warning carries no information for us.
warnings.filterwarnings("ignore", category=UserWarning, module="torchdata.datapipes")
