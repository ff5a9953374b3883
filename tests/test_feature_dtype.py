"""dataset.feature_dtype: a real 2-machine run whose servers hold float16 (bfloat16) features
trains, every assembled row (pulls and buffer hits) is the staged float32 row cast to that
dtype, bit for bit, and the records count 2 bytes per feature value."""
from __future__ import annotations

import json
import os

import pytest
import torch

from rudder.config import RunConfig
from rudder.data.store import load_graph
from rudder.records import read_jsonl
from rudder.runner import execute_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="emulated machines need root (network namespaces)"),
]


@pytest.mark.parametrize("dtype,suffix", [("float16", "f16"), ("bfloat16", "bf16")])
def test_half_precision_run_trains_on_the_cast_rows(tmp_path, dtype, suffix):
    """bfloat16 travels as int16 bits (DGL 2.1's servers hold no bfloat16), seen as bfloat16."""
    root = tmp_path / "data"
    half = getattr(torch, dtype)
    cfg = RunConfig.model_validate({
        "dataset": {"name": "synth-small", "root": str(root), "feature_dtype": dtype},
        "train": {"epochs": 2, "batch_size": 500, "lr": 0.01, "hidden": 32},
        "prefetch": {"policy": "lookahead", "prefetch_fraction": 0.5},
        "cluster": {"machines": 2, "start_timeout_s": 120, "run_timeout_s": 400},
        "runs_dir": str(tmp_path / "runs"),
    })
    res = execute_run(cfg, check=True)
    assert res.ok, res.reason
    run = json.loads((res.run_dir / "run.json").read_text())
    assert run["partition"]["params"]["feature_dtype"] == dtype
    assert run["part_config"].split(os.sep)[-2] == f"2-metis-{suffix}"
    graph = load_graph("synth-small", root)
    dim = graph.ndata["feat"].shape[1]
    new_to_orig = torch.load(os.path.join(os.path.dirname(run["part_config"]), "orig_nids.pt"))
    classes = run["num_classes"]
    for r in range(2):
        ctx = run["contexts"][str(r)]
        assert ctx["feat_bytes"] == 2 * dim and ctx["extra"]["feature_dtype"] == dtype
        mbs = read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")
        assert all(m["fetched_bytes"] == 2 * dim * m["fetched_rows"] for m in mbs)
        assert sum(m["hits"] for m in mbs) > 0  # buffer hits were assembled too
        done = json.loads((res.run_dir / f"done-r{r}.json").read_text())
        assert done["checked"] and done["mismatched_rows"] == 0
        saved = torch.load(res.run_dir / f"rows-r{r}.pt")
        assert saved
        for input_nodes, rows in saved:  # DistGraph (new) ids -> the staged graph's rows
            want = graph.ndata["feat"][new_to_orig[input_nodes]].to(half)
            assert rows.dtype == half
            assert torch.equal(rows.view(torch.int16), want.view(torch.int16))
        epochs = read_jsonl(res.run_dir / f"epochs-r{r}.jsonl")
        assert epochs[-1]["val_acc"] > max(0.5, 3.0 / classes)  # it learns (chance: 1/classes)
