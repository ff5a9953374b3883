"""Importers: edge lists (CSV/Parquet/npz) with features/labels/split round-trip; the OGB and
Reddit loaders on tiny files written here in the real on-disk layouts; clear errors."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rudder  # noqa: F401  (sets DGLBACKEND)
from rudder.data import importers, store

N = 60


@pytest.fixture(scope="module")
def raw():
    """A small random directed multigraph (with a self loop and a duplicate) plus data."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, N, 300)
    dst = rng.integers(0, N, 300)
    src[:3], dst[:3] = [5, 5, 9], [5, 6, 9 + 1]  # a self loop, then edge 5->6
    src, dst = np.append(src, 5), np.append(dst, 6)  # duplicate of 5->6
    src[-2], dst[-2] = N - 1, 0  # make sure the largest id occurs
    feat = rng.standard_normal((N, 5)).astype(np.float32)
    labels = rng.integers(0, 3, N)
    return src, dst, feat, labels


def expected_edges(src, dst):
    keys = {(int(a), int(b)) for a, b in zip(src, dst) if a != b}
    return keys | {(b, a) for a, b in keys}


def graph_edges(g):
    s, d = g.edges()
    return set(zip(s.tolist(), d.tolist()))


def write_edges(tmp: Path, fmt: str, src, dst) -> Path:
    if fmt == "csv":
        p = tmp / "edges.csv"
        pd.DataFrame({"src": src, "dst": dst}).to_csv(p, index=False)
    elif fmt == "parquet":
        p = tmp / "edges.parquet"
        pd.DataFrame({"src": src, "dst": dst}).to_parquet(p)
    else:
        p = tmp / "edges.npz"
        np.savez(p, src=src, dst=dst)
    return p


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npz"])
def test_edge_list_round_trip(tmp_path, raw, fmt):
    src, dst, feat, labels = raw
    edges = write_edges(tmp_path, fmt, src, dst)
    np.save(tmp_path / "feat.npy", feat)
    np.save(tmp_path / "labels.npy", labels)
    train, val = np.arange(0, 30), np.arange(30, 40)
    test = np.zeros(N, dtype=bool)
    test[40:] = True  # masks and index arrays both accepted
    np.savez(tmp_path / "split.npz", train=train, valid=val, test=test)
    root = tmp_path / "data"
    d = importers.import_edge_list(edges, "mine", root, features=tmp_path / "feat.npy",
                                   labels=tmp_path / "labels.npy",
                                   split=tmp_path / "split.npz")
    assert d == root / "mine"
    g = store.load_graph("mine", root)
    assert g.num_nodes() == N
    assert graph_edges(g) == expected_edges(src, dst)
    assert g.num_edges() == len(expected_edges(src, dst))  # no duplicates left
    assert np.array_equal(g.ndata["feat"].numpy(), feat)
    assert np.array_equal(g.ndata["label"].numpy(), labels)
    assert g.ndata["train_mask"].numpy().nonzero()[0].tolist() == train.tolist()
    assert g.ndata["val_mask"].numpy().nonzero()[0].tolist() == val.tolist()
    assert np.array_equal(g.ndata["test_mask"].numpy(), test)
    meta = store.read_meta("mine", root)
    assert meta["split"] == "given" and meta["classes"] == 3 and meta["feat_dim"] == 5
    assert meta["source"] == f"import:{edges.name}"
    assert store.is_staged("mine", root, verify=True)


def test_random_split_and_unlabeled(tmp_path, raw):
    src, dst, feat, _ = raw
    edges = write_edges(tmp_path, "csv", src, dst)
    lab = np.arange(N, dtype=np.float64) % 4
    lab[::5] = np.nan  # unlabeled
    pd.DataFrame({"label": lab}).to_csv(tmp_path / "labels.csv", index=False)
    pd.DataFrame(feat, columns=[f"f{i}" for i in range(5)]).to_parquet(tmp_path / "f.parquet")
    importers.import_edge_list(edges, "r", tmp_path, features=tmp_path / "f.parquet",
                               labels=tmp_path / "labels.csv", seed=1)
    g = store.load_graph("r", tmp_path)
    label = g.ndata["label"].numpy()
    assert (label[::5] == -1).all() and (label[1::5] >= 0).all()
    masks = [g.ndata[k].numpy() for k in ("train_mask", "val_mask", "test_mask")]
    total = masks[0].astype(int) + masks[1] + masks[2]
    assert total.max() == 1
    assert np.array_equal(total.astype(bool), label >= 0)  # exactly the labeled nodes
    assert abs(masks[0].sum() - 0.6 * (label >= 0).sum()) <= 1
    assert np.allclose(g.ndata["feat"].numpy(), feat)
    assert store.read_meta("r", tmp_path)["split"].startswith("random")


def test_no_labels_is_an_error_unless_generated(tmp_path, raw):
    src, dst, _, _ = raw
    edges = write_edges(tmp_path, "npz", src, dst)
    with pytest.raises(ValueError, match=r"no labels given.*--generate-labels"):
        importers.import_edge_list(edges, "bare", tmp_path, symmetric=False)
    assert not store.is_staged("bare", tmp_path)
    importers.import_edge_list(edges, "bare", tmp_path, symmetric=False, generate_labels=True)
    g = store.load_graph("bare", tmp_path)
    assert g.num_edges() == len(src)  # kept as given
    meta = store.read_meta("bare", tmp_path)
    assert meta["placeholders"] == ["feat", "label"] and g.ndata["feat"].shape[0] == N
    label = g.ndata["label"].numpy()
    # generated: the argmax class of a random map of the neighbours' mean features
    assert meta["classes_present"] == len(np.unique(label)) > 1
    s, d = g.edges()
    feat = g.ndata["feat"].numpy()
    want = importers.generated_labels(s.numpy(), d.numpy(), N, feat, seed=0)
    assert np.array_equal(label, want)


def test_generating_over_an_imported_graph_needs_force(tmp_path, raw):
    """`rudder data generate NAME` over a graph imported as NAME would replace the user's data."""
    src, dst, _, _ = raw
    importers.import_edge_list(write_edges(tmp_path, "npz", src, dst), "synth-tiny", tmp_path,
                               generate_labels=True)
    with pytest.raises(ValueError, match=r"synth-tiny in .* holds a graph from import:.*--force"):
        store.stage("synth-tiny", tmp_path)
    assert store.load_graph("synth-tiny", tmp_path).num_nodes() == N  # still the imported graph
    store.stage("synth-tiny", tmp_path, force=True)
    assert store.read_meta("synth-tiny", tmp_path)["source"] == "synthetic:synth-tiny"


def test_one_class_labels_are_recorded(tmp_path, raw):
    src, dst, _, _ = raw
    edges = write_edges(tmp_path, "npz", src, dst)
    np.save(tmp_path / "zeros.npy", np.zeros(N, dtype=np.int64))
    importers.import_edge_list(edges, "one", tmp_path, labels=tmp_path / "zeros.npy")
    assert store.read_meta("one", tmp_path)["classes_present"] == 1  # runs refuse accuracy


def test_npz_num_nodes_keeps_trailing_isolated_nodes(tmp_path):
    np.savez(tmp_path / "e.npz", src=np.array([0, 1]), dst=np.array([1, 2]), num_nodes=10)
    np.save(tmp_path / "y.npy", np.arange(10) % 2)
    importers.import_edge_list(tmp_path / "e.npz", "iso", tmp_path, labels=tmp_path / "y.npy")
    assert store.load_graph("iso", tmp_path).num_nodes() == 10
    np.savez(tmp_path / "bad.npz", src=np.array([0, 11]), dst=np.array([1, 2]), num_nodes=10)
    with pytest.raises(ValueError, match="node id 11 is out of range"):
        importers.import_edge_list(tmp_path / "bad.npz", "bad", tmp_path, generate_labels=True)


SNAP = """# Directed graph (each unordered pair of nodes is saved once): web-Tiny.txt
# Nodes: 6 Edges: 5
# FromNodeId	ToNodeId
0	1
1	2
2	3
# a comment further down
3	4
4	5
"""
KONECT = """% sym unweighted
% 5 6 6
0 1 1 1234
1 2 1 1235
2  3 1 1236
3 4 1 1237
4 5 1 1238
"""


@pytest.mark.parametrize("name,text,kw", [
    ("web-Tiny.txt", SNAP, {}),
    ("out.tiny", KONECT, {}),
    ("plain.csv", "0,1\n1,2\n2,3\n3,4\n4,5\n", {}),
    ("named.csv", "w,from,to\n9,0,1\n9,1,2\n9,2,3\n9,3,4\n9,4,5\n",
     {"src_col": "from", "dst_col": "to"}),
    ("cols.tsv", "7\t0\t1\n7\t1\t2\n7\t2\t3\n7\t3\t4\n7\t4\t5\n",
     {"src_col": "1", "dst_col": "2"}),
])
def test_text_edge_lists_as_users_have_them(tmp_path, name, text, kw):
    p = tmp_path / name
    p.write_text(text)
    src, dst = importers.read_edge_list(p, **kw)
    assert list(zip(src.tolist(), dst.tolist())) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_snap_gz_through_the_cli_with_split_fractions(tmp_path):
    from rudder.cli import main

    p = tmp_path / "web-Tiny.txt.gz"
    rng = np.random.default_rng(0)
    lines = "".join(f"{a}\t{b}\n" for a, b in rng.integers(0, 200, (800, 2)))
    with gzip.open(p, "wt") as f:
        f.write("# Directed graph\n# FromNodeId\tToNodeId\n" + lines + "199\t0\n")
    root = str(tmp_path / "data")
    assert main(["data", "import", "--name", "snap", "--edges", str(p), "--generate-labels",
                 "--split", "0.8,0.1,0.1", "--root", root]) == 0
    g = store.load_graph("snap", root)
    assert g.num_nodes() == 200
    counts = [int(g.ndata[k].sum()) for k in ("train_mask", "val_mask", "test_mask")]
    assert counts == [160, 20, 20]
    assert store.read_meta("snap", root)["split"] == "random(0.8, 0.1, 0.1)"


def test_cli_import_errors_name_the_fix(tmp_path, capsys):
    from rudder.cli import main

    p = tmp_path / "e.txt"
    p.write_text("0 1\n1 2\n")
    root = str(tmp_path / "data")
    assert main(["data", "import", "--name", "x", "--edges", str(p), "--root", root]) == 2
    assert "--generate-labels" in capsys.readouterr().err
    assert main(["data", "import", "--name", "x", "--edges", str(p), "--generate-labels",
                 "--split", "0.8,0.3,0.1", "--root", root]) == 2
    assert "0.8,0.3,0.1" in capsys.readouterr().err
    for sep in ("", ";;"):  # pandas' own words were "only single character unicode strings..."
        assert main(["data", "import", "--name", "x", "--edges", str(p), "--generate-labels",
                     f"--sep={sep}", "--root", root]) == 2
        assert f"sep {sep!r}: give tab, space" in capsys.readouterr().err
    assert not store.is_staged("x", root)


def test_fanouts_accepted_as_text():
    from rudder.config import RunConfig, TrainConfig

    assert TrainConfig(fanouts="15,10").fanouts == [15, 10]
    assert TrainConfig(fanouts=[5]).fanouts == [5]
    with pytest.raises(ValueError, match="fanouts"):
        TrainConfig(fanouts="15,x")
    with pytest.raises(ValueError, match="fanouts"):
        TrainConfig(fanouts="0,10")
    assert RunConfig.model_validate({"train": {"fanouts": "15,10"}}).train.fanouts == [15, 10]


def test_help_texts_name_real_commands():
    import argparse
    import re

    from rudder.cli import build_parser

    parser = build_parser()

    def subs(p):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                return a.choices
        return {}

    top = subs(parser)
    seen = 0

    def walk(p, path):
        nonlocal seen
        text = p.format_help() + (p.epilog or "")
        for m in re.finditer(r"`?rudder ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", text):
            seen += 1
            cmd, sub = m.group(1), m.group(2)
            assert cmd in top, f"{' '.join(path)} --help names `rudder {cmd}`"
            nested = subs(top[cmd])
            assert not (nested and sub and sub not in nested), \
                f"{' '.join(path)} --help names `rudder {cmd} {sub}`"
        for name, child in subs(p).items():
            walk(child, path + [name])

    walk(parser, ["rudder"])
    assert seen > 0


def test_already_staged_needs_overwrite(tmp_path, raw):
    src, dst, _, _ = raw
    edges = write_edges(tmp_path, "npz", src, dst)
    importers.import_edge_list(edges, "x", tmp_path, generate_labels=True)
    with pytest.raises(ValueError, match="already staged"):
        importers.import_edge_list(edges, "x", tmp_path, generate_labels=True)
    importers.import_edge_list(edges, "x", tmp_path, overwrite=True, generate_labels=True)


# ------------------------------------------------------------------------- errors

def _import_csv(tmp_path, text, **kw):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    return importers.import_edge_list(p, "bad", tmp_path / "data", generate_labels=True,
                                      **kw), p


@pytest.mark.parametrize("text,match", [
    ("source,dst\n0,1\n", r"missing column\(s\) \['src'\]"),
    ("src,dst\n0,1\na,2\n", "non-integer node ids"),
    ("src,dst\n0,1\n1.5,2\n", "non-integer node ids"),
    ("src,dst\n0,1\n-3,2\n", "negative node ids"),
    ("src,dst\n0,1\n1,100000000000000000000\n", "too large for int64 .e.g. 100000000000000000000 at row 1"),
    ("src,dst\n\n", "no edges"),  # a header and nothing else
    ("src,dst\n0,1\n,2\n", "missing/non-finite"),
])
def test_malformed_edge_list(tmp_path, text, match):
    with pytest.raises(ValueError, match=match) as e:
        _import_csv(tmp_path, text)
    assert "bad.csv" in str(e.value)
    assert not store.is_staged("bad", tmp_path / "data")


def test_npz_missing_arrays(tmp_path):
    np.savez(tmp_path / "e.npz", a=np.arange(3), dst=np.arange(3))
    with pytest.raises(ValueError, match=r"e\.npz: missing array\(s\) \['src'\]"):
        importers.import_edge_list(tmp_path / "e.npz", "e", tmp_path / "data")


def test_feature_rows_mismatch(tmp_path, raw):
    src, dst, feat, labels = raw
    edges = write_edges(tmp_path, "csv", src, dst)
    np.save(tmp_path / "feat.npy", feat[:-1])
    with pytest.raises(ValueError, match=r"feat\.npy.*59 rows.*60 nodes"):
        importers.import_edge_list(edges, "m", tmp_path, features=tmp_path / "feat.npy",
                                   num_nodes=N, generate_labels=True)
    np.save(tmp_path / "labels.npy", labels)
    with pytest.raises(ValueError, match="row counts differ"):
        importers.import_edge_list(edges, "m", tmp_path, features=tmp_path / "feat.npy",
                                   labels=tmp_path / "labels.npy")
    small = np.zeros((10, 2), np.float32)
    np.save(tmp_path / "small.npy", small)
    with pytest.raises(ValueError, match=r"edges\.csv: node id 59 is out of range"):
        importers.import_edge_list(edges, "m", tmp_path, features=tmp_path / "small.npy",
                                   generate_labels=True)


def test_missing_files(tmp_path, raw):
    with pytest.raises(FileNotFoundError, match="nothere.csv"):
        importers.import_edge_list(tmp_path / "nothere.csv", "m", tmp_path, generate_labels=True)
    edges = write_edges(tmp_path, "csv", *raw[:2])
    with pytest.raises(FileNotFoundError, match="nofeat.npy"):
        importers.import_edge_list(edges, "m", tmp_path, features=tmp_path / "nofeat.npy",
                                   generate_labels=True)


def test_bad_split(tmp_path, raw):
    edges = write_edges(tmp_path, "csv", *raw[:2])
    np.savez(tmp_path / "s.npz", train=[0, 1], val=[1], test=[2])
    with pytest.raises(ValueError, match="overlap"):
        importers.import_edge_list(edges, "m", tmp_path, split=tmp_path / "s.npz",
                                   generate_labels=True)
    np.savez(tmp_path / "s2.npz", train=[0, 1], test=[2])
    with pytest.raises(ValueError, match=r"s2\.npz: missing split array 'val'"):
        importers.import_edge_list(edges, "m", tmp_path, split=tmp_path / "s2.npz",
                                   generate_labels=True)
    np.savez(tmp_path / "s3.npz", train=[0, 100], val=[1], test=[2])
    with pytest.raises(ValueError, match="index 100 out of range"):
        importers.import_edge_list(edges, "m", tmp_path, split=tmp_path / "s3.npz",
                                   generate_labels=True)


# ------------------------------------------------------------------------- public layouts

def _gz_csv(path: Path, arr: np.ndarray, fmt: str = "%d") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        np.savetxt(fh, arr, fmt=fmt, delimiter=",")


def test_ogbn_products_layout(tmp_path, raw):
    src, dst, feat, labels = raw
    d = tmp_path / "ogbn_products"
    _gz_csv(d / "raw" / "edge.csv.gz", np.stack([src, dst], 1))
    _gz_csv(d / "raw" / "node-feat.csv.gz", feat, fmt="%.9g")
    _gz_csv(d / "raw" / "node-label.csv.gz", labels[:, None])
    for part, idx in (("train", range(0, 20)), ("valid", range(20, 25)),
                      ("test", range(25, N))):
        _gz_csv(d / "split" / "sales_ranking" / f"{part}.csv.gz", np.array(list(idx))[:, None])
    root = tmp_path / "data"
    importers.load_dataset("ogbn-products", d, root=root)
    g = store.load_graph("ogbn-products", root)
    assert graph_edges(g) == expected_edges(src, dst)
    assert np.allclose(g.ndata["feat"].numpy(), feat)
    assert np.array_equal(g.ndata["label"].numpy(), labels)
    assert int(g.ndata["train_mask"].sum()) == 20 and int(g.ndata["test_mask"].sum()) == 35
    assert store.read_meta("ogbn-products", root)["source"] == "ogbn-products"
    # staged once, reused after
    mtime = (root / "ogbn-products" / "graph.dgl").stat().st_mtime_ns
    importers.load_dataset("ogbn-products", d, root=root)
    assert (root / "ogbn-products" / "graph.dgl").stat().st_mtime_ns == mtime


def test_ogbn_products_missing_file(tmp_path, raw):
    src, dst, _, _ = raw
    d = tmp_path / "p"
    _gz_csv(d / "raw" / "edge.csv.gz", np.stack([src, dst], 1))
    with pytest.raises(FileNotFoundError, match=r"node-feat\.csv\.gz"):
        importers.load_dataset("ogbn-products", d, root=tmp_path / "data")


def test_ogbn_papers100m_layout(tmp_path, raw):
    src, dst, feat, labels = raw
    d = tmp_path / "ogbn_papers100M"
    (d / "raw").mkdir(parents=True)
    np.savez_compressed(d / "raw" / "data.npz", edge_index=np.stack([src, dst]),
                        node_feat=feat, num_nodes_list=np.array([N]),
                        num_edges_list=np.array([len(src)]))
    lab = labels.astype(np.float32)[:, None]
    lab[40:] = np.nan
    np.savez_compressed(d / "raw" / "node-label.npz", node_label=lab)
    for part, idx in (("train", range(0, 25)), ("valid", range(25, 32)),
                      ("test", range(32, 40))):
        _gz_csv(d / "split" / "time" / f"{part}.csv.gz", np.array(list(idx))[:, None])
    root = tmp_path / "data"
    importers.load_dataset("ogbn-papers100M", d, root=root, name="papers")
    g = store.load_graph("papers", root)
    assert graph_edges(g) == expected_edges(src, dst)
    assert np.array_equal(g.ndata["feat"].numpy(), feat)
    lab_out = g.ndata["label"].numpy()
    assert (lab_out[40:] == -1).all() and np.array_equal(lab_out[:40], labels[:40])
    assert int(g.ndata["val_mask"].sum()) == 7
    meta = store.read_meta("papers", root)
    assert meta["labeled"] == 40 and meta["source"] == "ogbn-papers100M"


def test_papers_bad_npz(tmp_path):
    d = tmp_path / "pp"
    (d / "raw").mkdir(parents=True)
    np.savez(d / "raw" / "data.npz", edge_index=np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match=r"data\.npz: missing array\(s\) \['node_feat', "
                                         r"'num_nodes'\]"):
        importers.load_dataset("ogbn-papers100M", d, root=tmp_path / "data")


def test_reddit_layout(tmp_path, raw):
    import scipy.sparse as sp

    src, dst, feat, labels = raw
    d = tmp_path / "reddit"
    d.mkdir()
    types = np.full(N, 3)
    types[:30], types[30:40] = 1, 2
    np.savez(d / "reddit_data.npz", feature=feat, label=labels, node_types=types,
             node_ids=np.arange(N))
    keys = sorted(expected_edges(src, dst))
    row, col = np.array(keys).T
    sp.save_npz(d / "reddit_graph.npz", sp.coo_matrix((np.ones(len(row)), (row, col)),
                                                      shape=(N, N)))
    root = tmp_path / "data"
    importers.load_dataset("reddit", d, root=root)
    g = store.load_graph("reddit", root)
    assert graph_edges(g) == set(keys)
    assert np.array_equal(g.ndata["train_mask"].numpy(), types == 1)
    assert np.array_equal(g.ndata["val_mask"].numpy(), types == 2)
    assert np.array_equal(g.ndata["label"].numpy(), labels)


def test_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset loader 'ogbn-arxiv'.*reddit"):
        importers.load_dataset("ogbn-arxiv", tmp_path)
    with pytest.raises(FileNotFoundError, match="nodir"):
        importers.load_dataset("reddit", tmp_path / "nodir")
    with pytest.raises(FileNotFoundError, match=r"reddit_data\.npz"):
        importers.load_dataset("reddit", tmp_path)


def test_cli_import_and_load(tmp_path, raw, capsys):
    from rudder.cli import main

    src, dst, feat, labels = raw
    edges = write_edges(tmp_path, "npz", src, dst)
    np.save(tmp_path / "feat.npy", feat)
    root = str(tmp_path / "data")
    assert main(["data", "import", "--name", "cli", "--edges", str(edges), "--features",
                 str(tmp_path / "feat.npy"), "--generate-labels", "--root", root]) == 0
    assert store.read_meta("cli", root)["feat_dim"] == 5
    assert main(["data", "import", "--name", "cli", "--edges", str(edges), "--root",
                 root, "--generate-labels"]) == 2
    assert "already staged" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["data", "import", "--name", "b", "--edges", str(bad), "--root", root,
                 "--src-col", "src", "--header"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "missing column" in err
    assert main(["data", "load-ogb", "--name", "reddit", "--dir", str(tmp_path / "none"),
                 "--root", root]) == 2
    assert "not found" in capsys.readouterr().err
