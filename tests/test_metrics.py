"""MetricsCollector: window aggregates, and the buffer state read only when a window closes."""
from __future__ import annotations

import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.metrics import MetricsCollector, buffer_state
from rudder.records import WindowRecord


def rec(g, remote, hits, fetched):
    return {"global_step": g, "remote_rows": remote, "hits": hits, "fetched_rows": fetched,
            "replaced_rows": 0, "t_fetch": 0.1, "t_stall": 0.0, "t_sample": 0.2, "t_compute": 0.3}


def test_windows_close_every_n_and_read_the_buffer_only_then():
    col = MetricsCollector(window=3)
    calls = []

    def state():
        calls.append(1)
        return {"buffer_fill": 7}

    out = [col.add(rec(g, 10, g, 10 - g), state) for g in range(7)]
    assert [w is not None for w in out] == [False, False, True, False, False, True, False]
    assert len(calls) == 2  # not once per minibatch
    w = out[2]
    assert (w["window"], w["first_step"], w["last_step"], w["minibatches"]) == (0, 0, 2, 3)
    assert w["hit_rate"] == (0 + 1 + 2) / 30 and w["fetched_rows"] == 27 and w["buffer_fill"] == 7
    assert abs(w["t_minibatch"] - 0.6) < 1e-9
    tail = col.close()
    assert tail["minibatches"] == 1 and tail["first_step"] == 6


def test_buffer_state_counts_what_the_known_future_lacks():
    buf = HaloBuffer(torch.arange(10), 3, 0, store_features=False)
    buf.fill(torch.tensor([0, 1, 2]))
    # future needs 1, 2 (buffered), 5, 6 (not), and 50 (not a halo node: never counted)
    s = buffer_state(buf, [torch.tensor([1, 5, 50]), torch.tensor([2, 5, 6])])
    assert s == {"buffer_fill": 3, "stale_slots": 0, "stale_half": 0, "lookahead_missing": 2, "lookahead_rows": 2,
                 "lookahead_minibatches": 2}  # over how many minibatches (schedule_ahead: it grows)
    assert "lookahead_minibatches" not in buffer_state(buf, [])  # lookahead off: windows as before
    assert buffer_state(None, []) == {}
    rec = WindowRecord(window=0, first_step=0, last_step=9, minibatches=10, hit_rate=0.0, remote_rows=0,
                       fetched_rows=0, replaced_rows=0, t_fetch=0.0, t_stall=0.0, t_minibatch=0.0, **s)
    assert rec.to_dict()["lookahead_minibatches"] == 2


def test_lookahead_rows_are_capped_at_the_capacity():
    buf = HaloBuffer(torch.arange(10), 2, 0, store_features=False)
    buf.fill(torch.tensor([0, 1]))
    s = buffer_state(buf, [torch.tensor([5, 6]), torch.tensor([7, 0])])
    assert s["lookahead_missing"] == 3 and s["lookahead_rows"] == 2  # one round fills at most 2
