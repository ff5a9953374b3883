"""The trace format now lives beside the records (rudder.trace): the trainer writes it without
importing the simulator. This name stays for old imports."""
from rudder.trace import Trace, TraceWriter, find_traces, halo_index  # noqa: F401
