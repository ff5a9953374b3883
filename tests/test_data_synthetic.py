"""Synthetic graphs and the staged store: determinism, structure, label signal, reuse, errors."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import rudder  # noqa: F401  (sets DGLBACKEND)
from rudder.data import store
from rudder.data.synthetic import (PRESETS, SyntheticSpec, generate, generate_arrays,
                                   resolve_spec, sorted_unique)

TINY = PRESETS["synth-tiny"]


@pytest.fixture(scope="module")
def tiny():
    return generate_arrays(TINY)


@pytest.fixture(scope="module")
def small():
    return generate_arrays(PRESETS["synth-small"])


def _edge_keys(a, n):
    return a.src.astype(np.int64) * n + a.dst


# ------------------------------------------------------------------------- determinism

def test_same_seed_same_graph(tiny):
    again = generate_arrays(TINY)
    for field in ("src", "dst", "feat", "label", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(tiny, field), getattr(again, field)), field


def test_other_seed_other_graph(tiny):
    other = generate_arrays(resolve_spec("synth-tiny", seed=1))
    assert not np.array_equal(tiny.feat, other.feat)
    assert not np.array_equal(tiny.label, other.label)
    k0, k1 = set(_edge_keys(tiny, TINY.nodes)), set(_edge_keys(other, TINY.nodes))
    assert len(k0 & k1) < 0.5 * len(k0)


def test_dgl_graph_matches_arrays(tiny):
    g = generate("synth-tiny")
    src, dst = g.edges()
    assert np.array_equal(src.numpy(), tiny.src) and np.array_equal(dst.numpy(), tiny.dst)
    assert g.num_nodes() == TINY.nodes
    assert g.ndata["feat"].dtype.is_floating_point and g.ndata["feat"].element_size() == 4
    assert tuple(g.ndata["feat"].shape) == (TINY.nodes, TINY.feat_dim)
    assert str(g.ndata["label"].dtype) == "torch.int64"
    for m in ("train_mask", "val_mask", "test_mask"):
        assert str(g.ndata[m].dtype) == "torch.bool"


# ------------------------------------------------------------------------- structure

def test_symmetric_no_self_loops_no_duplicates(tiny):
    n = TINY.nodes
    assert not np.any(tiny.src == tiny.dst)
    fwd = _edge_keys(tiny, n)
    assert sorted_unique(fwd).shape[0] == fwd.shape[0]  # no duplicate edges
    rev = tiny.dst.astype(np.int64) * n + tiny.src
    assert np.array_equal(np.sort(fwd), np.sort(rev))  # every edge has its reverse


def test_size_matches_preset(small):
    spec = PRESETS["synth-small"]
    assert small.feat.shape == (20_000, 32) and small.feat.dtype == np.float32
    assert small.label.max() == 7 and small.label.min() == 0 and small.label.dtype == np.int64
    avg = small.src.shape[0] / spec.nodes
    assert abs(avg - spec.avg_degree) / spec.avg_degree < 0.02


def test_degrees_heavy_tailed(small):
    deg = np.bincount(small.dst, minlength=20_000)
    assert deg.max() > 10 * deg.mean()
    assert np.percentile(deg, 99) > 4 * np.median(deg)


def test_communities_planted(small):
    inside = (small.community[small.src] == small.community[small.dst]).mean()
    assert inside > 0.7
    assert len(np.unique(small.community)) == PRESETS["synth-small"].communities


def test_masks_disjoint_and_sized(tiny):
    total = tiny.train_mask.astype(int) + tiny.val_mask + tiny.test_mask
    assert total.max() == 1
    n = TINY.nodes
    assert abs(tiny.train_mask.sum() - TINY.train_frac * n) <= 1
    assert abs(tiny.val_mask.sum() - TINY.val_frac * n) <= 1
    assert abs(tiny.test_mask.sum() - TINY.test_frac * n) <= 1


def test_label_signal_and_neighbours_help(tiny):
    """Features alone beat chance clearly; adding the neighbours' mean features helps."""
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression

    a, n, c = tiny, TINY.nodes, TINY.classes
    adj = sp.csr_matrix((np.ones(a.src.shape[0], np.float32), (a.dst, a.src)), shape=(n, n))
    deg = np.maximum(np.asarray(adj.sum(1)).ravel(), 1)
    nbr = (adj @ a.feat) / deg[:, None]

    def acc(x):
        clf = LogisticRegression(max_iter=300).fit(x[a.train_mask], a.label[a.train_mask])
        return clf.score(x[a.test_mask], a.label[a.test_mask])

    alone, with_nbrs = acc(a.feat), acc(np.hstack([a.feat, nbr]))
    majority = np.bincount(a.label).max() / n
    assert alone > max(2 / c, majority + 0.25), alone
    assert with_nbrs > alone + 0.05, (alone, with_nbrs)


# ------------------------------------------------------------------------- specs

def test_unknown_preset_lists_valid():
    with pytest.raises(ValueError) as e:
        resolve_spec("synth-huge")
    assert str(e.value) == f"unknown synthetic preset 'synth-huge'; valid: {', '.join(sorted(PRESETS))}"


def test_custom_spec():
    arr = generate_arrays(resolve_spec({"nodes": 500, "avg_degree": 6, "communities": 5,
                                        "feat_dim": 3, "classes": 3, "seed": 4}))
    assert arr.feat.shape == (500, 3) and set(np.unique(arr.label)) == {0, 1, 2}
    assert abs(arr.src.shape[0] / 500 - 6) < 0.3


@pytest.mark.parametrize("bad", [{"nodes": 1}, {"nodes": 100, "classes": 1},
                                 {"nodes": 100, "avg_degree": 0},
                                 {"nodes": 100, "degree_exponent": 1.5}])
def test_invalid_spec(bad):
    with pytest.raises(ValueError, match="invalid synthetic spec"):
        SyntheticSpec(**bad)


def test_unknown_spec_key():
    with pytest.raises(ValueError, match="nodez"):
        resolve_spec({"nodez": 10})


def test_presets_sizes():
    assert PRESETS["synth-bench"].nodes == 1_000_000
    assert PRESETS["synth-bench"].undirected_edges * 2 == 20_000_000
    assert PRESETS["synth-bench"].feat_dim == 128 and PRESETS["synth-bench"].classes == 47
    assert PRESETS["synth-medium"].nodes == 200_000


# ------------------------------------------------------------------------- store

def test_stage_reuse_and_load(tmp_path):
    d = store.stage("synth-tiny", root=tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    assert meta["nodes"] == TINY.nodes and meta["feat_dim"] == TINY.feat_dim
    assert meta["classes"] == TINY.classes and meta["seed"] == 0
    assert meta["source"] == "synthetic:synth-tiny" and len(meta["checksum"]) == 64
    mtime = (d / "graph.dgl").stat().st_mtime_ns
    assert store.stage("synth-tiny", root=tmp_path) == d
    assert (d / "graph.dgl").stat().st_mtime_ns == mtime  # reused, not rewritten
    g = store.load_graph("synth-tiny", tmp_path)
    assert store.graph_checksum(g) == meta["checksum"]
    assert g.num_edges() == meta["edges"]
    assert store.is_staged("synth-tiny", tmp_path, verify=True)

    # another seed regenerates (and changes the checksum)
    store.stage("synth-tiny", root=tmp_path, seed=3)
    meta3 = store.read_meta("synth-tiny", tmp_path)
    assert meta3["seed"] == 3 and meta3["checksum"] != meta["checksum"]


def test_truncated_file_is_restaged(tmp_path):
    d = store.stage("synth-tiny", root=tmp_path)
    with open(d / "graph.dgl", "r+b") as fh:
        fh.truncate(100)
    assert not store.is_staged("synth-tiny", tmp_path)
    store.stage("synth-tiny", root=tmp_path)
    assert store.is_staged("synth-tiny", tmp_path, verify=True)


def test_custom_spec_staged(tmp_path):
    d = store.stage("mine", root=tmp_path, spec={"nodes": 300, "avg_degree": 4,
                                                  "communities": 3, "feat_dim": 2,
                                                  "classes": 2})
    meta = store.read_meta("mine", tmp_path)
    assert meta["nodes"] == 300 and meta["source"] == "synthetic:custom" and d.name == "mine"
    assert store.stage("mine", root=tmp_path) == d  # now staged: reusable by name


def test_unknown_dataset_error(tmp_path):
    store.stage("synth-tiny", root=tmp_path)
    with pytest.raises(ValueError) as e:
        store.stage("nope", root=tmp_path)
    msg = str(e.value)
    assert "'nope'" in msg and "synth-small" in msg and "ogbn-products" in msg
    assert "staged: synth-tiny" in msg
    with pytest.raises(ValueError, match="nope"):
        store.load_graph("nope", tmp_path)
    with pytest.raises(ValueError, match="invalid dataset name"):
        store.stage("../x", root=tmp_path)


def test_list_datasets(tmp_path):
    store.stage("synth-tiny", root=tmp_path)
    rows = {r["name"]: r for r in store.list_datasets(tmp_path)}
    assert rows["synth-tiny"]["staged"] and rows["synth-tiny"]["nodes"] == TINY.nodes
    assert not rows["synth-small"]["staged"] and rows["reddit"]["kind"] == "loader"
    assert store.list_datasets(tmp_path / "missing")  # presets even without a data folder


# ------------------------------------------------------------------------- CLI

def test_cli_generate_list_errors(tmp_path, capsys):
    from rudder.cli import main

    assert main(["data", "generate", "synth-tiny", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "synth-tiny")
    assert main(["data", "generate", "cust", "--nodes", "200", "--avg-degree", "4",
                 "--communities", "2", "--feat-dim", "3", "--classes", "2", "--root",
                 str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["data", "list", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "synth-tiny" in out and "cust" in out and "synth-bench" in out
    assert main(["data", "list", "--json", "--root", str(tmp_path)]) == 0
    assert any(r["name"] == "cust" for r in json.loads(capsys.readouterr().out))
    assert main(["data", "generate", "synth-nope", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "synth-nope" in err and "synth-small" in err
    assert not os.path.exists(tmp_path / "synth-nope")
    # a --root that is missing still lists the presets, and says why none is staged; a file is refused
    assert main(["data", "list", "--root", str(tmp_path / "typo")]) == 0
    res = capsys.readouterr()
    assert f"no data folder at {tmp_path / 'typo'}" in res.err and "synth-bench" in res.out
    (tmp_path / "afile").write_text("x")
    assert main(["data", "list", "--root", str(tmp_path / "afile")]) == 2
    assert "is a file, not a data folder" in capsys.readouterr().err
