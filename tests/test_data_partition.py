"""Partitioning: manifest facts checked against independent counts, id maps, reuse, errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

import rudder  # noqa: F401  (sets DGLBACKEND)
from rudder.data import partition as P
from rudder.data import store

NAME = "synth-tiny"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("data")
    store.stage(NAME, root=r)
    return r


@pytest.fixture(scope="module")
def graph(root):
    return store.load_graph(NAME, root)


@pytest.fixture(scope="module")
def parts2(root):
    return P.partition(NAME, 2, root=root)


@pytest.fixture(scope="module")
def parts4(root):
    return P.partition(NAME, 4, root=root)


def _load_part(info, p):
    import dgl

    return dgl.load_graphs(str(info.dir / f"part{p}" / "graph.dgl"))[0][0]


@pytest.mark.parametrize("which", ["parts2", "parts4"])
def test_manifest_matches_partition_files(request, which, graph):
    import dgl

    info = request.getfixturevalue(which)
    m = info.manifest
    k = info.num_parts
    assert info.part_config == info.dir / f"{NAME}.json" and info.part_config.exists()
    assert info.dir.name == f"{k}-metis"
    assert m["graph_checksum"] == store.read_meta(NAME, info.dir.parents[2])["checksum"]
    assert m["params"] == {"num_parts": k, "method": "metis", "balance_train": True,
                           "balance_edges": True, "num_hops": 1, "seed": 0}
    assert "NEW ids" in m["ids"]
    orig = info.orig_nids()
    n = graph.num_nodes()
    assert sorted(orig.tolist()) == list(range(n))  # a permutation
    new = info.new_nids()
    assert (orig[new] == np.arange(n)).all()

    # independent count of owned / halo nodes and of the cut from the part graphs
    owner_new = np.empty(n, dtype=np.int64)
    lo = 0
    for p, rec in enumerate(m["partitions"]):
        pg = _load_part(info, p)
        inner = pg.ndata["inner_node"].numpy().astype(bool)
        assert rec["owned_nodes"] == int(inner.sum())
        assert rec["halo_nodes"] == int((~inner).sum()) == pg.num_nodes() - rec["owned_nodes"]
        assert rec["edges"] == pg.num_edges()
        gids = pg.ndata[dgl.NID].numpy()
        assert rec["node_range"] == [lo, lo + rec["owned_nodes"]]  # contiguous new ids
        assert np.array_equal(np.sort(gids[inner]), np.arange(lo, lo + rec["owned_nodes"]))
        owner_new[lo:lo + rec["owned_nodes"]] = p
        lo += rec["owned_nodes"]
        # node features of the partition are the original rows, in new-id order
        feats = dgl.data.utils.load_tensors(str(info.dir / f"part{p}" / "node_feat.dgl"))
        want = graph.ndata["feat"][orig[rec["node_range"][0]:rec["node_range"][1]]]
        assert np.array_equal(feats["_N/feat"].numpy(), want.numpy())
        # train seeds owned here (balance_train)
        assert rec["train_nodes"] == int(feats["_N/train_mask"].numpy().astype(bool).sum())
        # every halo node is an in-neighbour of an owned node (1-hop halo)
        src, dst = pg.edges()
        halo_local = np.flatnonzero(~inner)
        assert np.isin(halo_local, src.numpy()[inner[dst.numpy()]]).all()
    assert lo == n

    # edge cut from the original graph + the ownership: edges whose ends live apart
    owner_orig = np.empty(n, dtype=np.int64)
    owner_orig[orig.numpy()] = owner_new
    s, d = (t.numpy() for t in graph.edges())
    cut = owner_orig[s] != owner_orig[d]
    assert m["edge_cut"] == int(cut.sum())
    for p, rec in enumerate(m["partitions"]):
        assert rec["edge_cut"] == int((cut & (owner_orig[d] == p)).sum())
    assert m["halo_nodes"] == sum(r["halo_nodes"] for r in m["partitions"])
    # halo of p = distinct nodes owned elsewhere with an edge into p
    for p, rec in enumerate(m["partitions"]):
        into_p = (owner_orig[d] == p) & (owner_orig[s] != p)
        assert rec["halo_nodes"] == len(np.unique(s[into_p]))


def test_metis_balances_train_and_cuts_less_than_random(root, parts4):
    trains = [r["train_nodes"] for r in parts4.manifest["partitions"]]
    assert all(abs(t - np.mean(trains)) <= 0.1 * np.mean(trains) for t in trains)  # METIS: ±5%
    rnd = P.partition(NAME, 4, method="random", root=root)
    assert rnd.dir.name == "4-random"
    assert rnd.manifest["edge_cut_frac"] > 2 * parts4.manifest["edge_cut_frac"]
    assert rnd.manifest["params"]["seed"] == 0


def test_reuse_does_not_repartition(root, parts2):
    files = [parts2.dir / "manifest.json", parts2.dir / "part0" / "graph.dgl",
             parts2.dir / "orig_nids.pt"]
    before = [f.stat().st_mtime_ns for f in files]
    again = P.partition(NAME, 2, root=root)
    assert again.reused and again.manifest == parts2.manifest
    assert [f.stat().st_mtime_ns for f in files] == before


def test_one_part(root, graph):
    info = P.partition(NAME, 1, root=root)
    (rec,) = info.manifest["partitions"]
    assert rec["owned_nodes"] == graph.num_nodes() and rec["halo_nodes"] == 0
    assert rec["edge_cut"] == 0 and info.manifest["edge_cut"] == 0
    assert rec["edges"] == graph.num_edges()


def test_variants_get_own_folders(root, capsys):
    info = P.partition(NAME, 2, balance_train=False, balance_edges=False, root=root)
    out, err = capsys.readouterr()
    assert "Save partitions" in err and not out  # DGL's progress goes to stderr
    assert "edge cuts for" not in err  # DGL's wrong "0 edge cuts" line is dropped
    assert info.dir.name == "2-metis-nobaltrain-nobaledges"
    assert info.manifest["params"]["balance_train"] is False


def test_invalid_partitioning_is_redone(tmp_path):
    store.stage(NAME, root=tmp_path)
    first = P.partition(NAME, 2, root=tmp_path)
    # a missing partition file -> redone
    (first.dir / "part1" / "node_feat.dgl").unlink()
    second = P.partition(NAME, 2, root=tmp_path)
    assert not second.reused and (second.dir / "part1" / "node_feat.dgl").exists()
    # the graph changed (restaged with another seed) -> redone, new checksum recorded
    store.stage(NAME, root=tmp_path, seed=5)
    third = P.partition(NAME, 2, root=tmp_path)
    assert not third.reused
    assert third.manifest["graph_checksum"] == store.read_meta(NAME, tmp_path)["checksum"]
    assert third.manifest["graph_checksum"] != first.manifest["graph_checksum"]
    # force=True redoes a valid one
    assert not P.partition(NAME, 2, root=tmp_path, force=True).reused
    assert [i.dir.name for i in P.list_partitions(NAME, tmp_path)] == ["2-metis"]


def test_errors(root):
    with pytest.raises(ValueError, match="unknown partition method 'kahip'.*metis"):
        P.partition(NAME, 2, method="kahip", root=root)
    with pytest.raises(ValueError, match="positive integer"):
        P.partition(NAME, 0, root=root)
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        P.partition("nope", 2, root=root)


def test_cli_partition(root, parts2, capsys):
    from rudder.cli import main

    assert main(["data", "partition", NAME, "--parts", "2", "--root", str(root)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(parts2.part_config)
    assert json.loads(parts2.part_config.read_text())["num_parts"] == 2
    with pytest.raises(SystemExit) as e:  # argparse choices
        main(["data", "partition", NAME, "--parts", "2", "--method", "kahip"])
    assert e.value.code == 2 and "kahip" in capsys.readouterr().err
    assert main(["data", "list", "--root", str(root)]) == 0
    assert "2-metis" in capsys.readouterr().out


@pytest.mark.parametrize("dtype,suffix", [("float16", "-f16"), ("bfloat16", "-bf16")])
def test_feature_dtype_partition_serves_the_cast_rows(root, graph, parts2, dtype, suffix):
    """A float16/bfloat16 partitioning stores exactly the float32 rows cast (round to nearest),
    lives beside the float32 one and never stands in for it (params, folder, file digests)."""
    import dgl
    import torch

    info = P.partition(NAME, 2, root=root, feature_dtype=dtype)
    assert info.dir.name == f"2-metis{suffix}" and info.dir != parts2.dir
    m = info.manifest
    assert m["params"]["feature_dtype"] == dtype and "feature_dtype" not in parts2.manifest["params"]
    assert m["feature_dtype"] == dtype
    assert m["feature_row_bytes"] == graph.ndata["feat"].shape[1] * 2
    assert m["files"]["part0/node_feat.dgl"] != parts2.manifest["files"]["part0/node_feat.dgl"]
    # the same cut as float32 (the cast never cuts again): only the features are cast
    assert {k: v for k, v in m["files"].items() if "node_feat" not in k} == \
        {k: v for k, v in parts2.manifest["files"].items() if "node_feat" not in k}
    assert m["partitions"] == parts2.manifest["partitions"]
    orig = info.orig_nids()
    for p, rec in enumerate(m["partitions"]):
        feats = dgl.data.utils.load_tensors(str(info.dir / f"part{p}" / "node_feat.dgl"))["_N/feat"]
        # bfloat16 is stored as its int16 bits (DGL 2.1's servers hold no bfloat16)
        assert feats.dtype == getattr(torch, P.STORED_AS.get(dtype, dtype))
        assert m["feature_stored_as"] == P.STORED_AS.get(dtype, dtype)
        want = graph.ndata["feat"][orig[rec["node_range"][0]:rec["node_range"][1]]]
        assert torch.equal(feats.view(torch.int16), want.to(getattr(torch, dtype)).view(torch.int16))
        seen = P.served_features(feats, dtype)[torch.tensor([0, 2])]  # the trainer's view
        assert seen.dtype == getattr(torch, dtype) and torch.equal(seen, want[[0, 2]].to(seen.dtype))
    # the same partition asked again is reused; float32 is still the float32 one
    assert P.partition(NAME, 2, root=root, feature_dtype=dtype).reused
    again = P.partition(NAME, 2, root=root)
    assert again.reused and again.dir == parts2.dir


def test_cast_partitioning_follows_a_new_float32_cut(tmp_path):
    """A float16 copy whose structure files no longer match the float32 partitioning's (made
    from an older cut) is made again from the current one."""
    import json as _json

    from rudder.data.store import file_sha256

    first = P.partition(NAME, 2, root=tmp_path, feature_dtype="float16")
    assert not first.reused
    assert P.partition(NAME, 2, root=tmp_path, feature_dtype="float16").reused
    # the copy's graph of partition 0 from another cut, its own digest consistent
    g = first.dir / "part0" / "graph.dgl"
    other = (first.dir / "part1" / "graph.dgl").read_bytes()
    g.unlink()  # a hard link to the float32 file: never written through
    g.write_bytes(other)
    m = _json.loads((first.dir / "manifest.json").read_text())
    m["files"]["part0/graph.dgl"] = file_sha256(g)
    (first.dir / "manifest.json").write_text(_json.dumps(m))
    again = P.partition(NAME, 2, root=tmp_path, feature_dtype="float16")
    assert not again.reused
    base = P.partition(NAME, 2, root=tmp_path)
    assert base.reused  # the float32 partitioning was left alone
    assert again.manifest["files"]["part0/graph.dgl"] == base.manifest["files"]["part0/graph.dgl"]


def test_feature_dtype_errors(root):
    import torch

    with pytest.raises(RuntimeError, match="the servers hold float32 features, "
                                           "dataset.feature_dtype is float16"):
        P.served_features(torch.zeros(2, 3), "float16")
    with pytest.raises(RuntimeError, match="hold float16 features, dataset.feature_dtype is bfloat16"):
        P.served_features(torch.zeros(2, 3, dtype=torch.float16), "bfloat16")

    with pytest.raises(ValueError, match="unknown feature dtype 'int8'; valid: float32, float16"):
        P.partition(NAME, 2, root=root, feature_dtype="int8")
    with pytest.raises(ValueError, match=r"2 feature values overflow float16 .*\| 70000\)"):
        P.cast_features(torch.tensor([[1.0, 7e4], [-7e4, 2.0]]), "float16")
    assert P.cast_features(torch.tensor([[7e4]]), "bfloat16").dtype == torch.bfloat16
