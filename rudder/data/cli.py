"""`rudder data ...`: stage, import, load, partition and list datasets.

Progress goes to stderr through logging; `list` prints its table to stdout. torch/dgl are
imported inside the command functions so `rudder --help` stays fast.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

log = logging.getLogger("rudder.data")

DEFAULT_ROOT = "data"
GENERATED_CLASSES = 8  # = rudder.data.importers.GENERATED_CLASSES (not imported: numpy-free help)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="stage, import, partition and list datasets",
                              description="Datasets live in <root>/<name>/ (graph.dgl + "
                              "meta.json), partitions in <root>/<name>/parts/<P>-<method>/.")
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--root", default=DEFAULT_ROOT, help="data folder (default: data)")

    g = sub.add_parser("generate", help="generate and stage a synthetic graph",
                       description="Stage a synthetic preset (synth-tiny, synth-small, "
                       "synth-medium, synth-bench, synth-ring, synth-ring-bench), or a custom graph named NAME when --nodes "
                       "is given. Reuses a valid staging with the same spec and seed.")
    g.add_argument("name", metavar="NAME")
    common(g)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--force", action="store_true", help="regenerate even if staged")
    g.add_argument("--nodes", type=int, help="custom graph: number of nodes")
    g.add_argument("--avg-degree", type=float, help="custom graph: mean degree (default 16)")
    g.add_argument("--communities", type=int, help="custom graph: planted communities")
    g.add_argument("--feat-dim", type=int, help="custom graph: feature dimension")
    g.add_argument("--classes", type=int, help="custom graph: label classes")
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser(
        "import", help="stage an edge list (SNAP/KONECT text, CSV, Parquet or npz)",
        description="Stage a graph from an edge list as users have it. Text edge lists: a CSV "
        "with a src,dst header, or SNAP/KONECT style (lines starting with # or %% are "
        "comments; tab or whitespace separated; no header; columns after the first two, such "
        "as weights, are ignored). Separator and header are sniffed from the first data line "
        "unless given. Labels are required, or --generate-labels.",
        epilog="examples:\n"
        "  rudder data import --name web-google --edges web-Google.txt.gz --generate-labels\n"
        "  rudder data import --name g --edges out.konect --labels y.npy --split 0.8,0.1,0.1\n"
        "  rudder data import --name g --edges e.csv --src-col from --dst-col to "
        "--features x.npy --labels y.csv\n"
        "then: rudder data partition NAME --parts 2; rudder run --set dataset.name=NAME",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("--name", required=True, help="dataset name (folder under --root)")
    i.add_argument("--edges", required=True, help="edge list: text (.txt/.csv/.tsv/.edges/"
                   "KONECT out.*, optionally .gz/.bz2/.xz), Parquet, or npz with arrays "
                   "src,dst or edge_index (and num_nodes, honoured)")
    i.add_argument("--features", help="node features: npy, npz, csv or parquet (row = node); "
                   "default: random 16-dim features")
    i.add_argument("--labels", help="node labels: npy, npz, csv or parquet (NaN = unlabeled)")
    i.add_argument("--generate-labels", action="store_true",
                   help=f"no labels file: make {GENERATED_CLASSES} classes from the graph "
                   "(argmax of a seeded random map of the mean of each node's neighbours' "
                   "features); accuracy then only shows that training learns")
    i.add_argument("--split", help="train,val,test fractions of the labeled nodes, e.g. "
                   "0.8,0.1,0.1, or an npz with train/val/test masks or index arrays "
                   "(default: 0.6,0.2,0.2)")
    i.add_argument("--format", choices=["csv", "parquet", "npz"],
                   help="edge-list format (default: from the file name; unknown names are "
                   "read as text)")
    i.add_argument("--src-col", default="src", help="source column: a header name, or a "
                   "0-based position (default: src, i.e. the first column without a header)")
    i.add_argument("--dst-col", default="dst", help="destination column (default: dst, i.e. "
                   "the second column without a header)")
    hdr = i.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_true", default=None,
                     help="the first data line is a header (default: sniffed)")
    hdr.add_argument("--no-header", dest="header", action="store_false",
                     help="the first data line is an edge")
    i.add_argument("--sep", help="text separator: tab, space (any whitespace) or a "
                   "character such as , (default: sniffed)")
    i.add_argument("--num-nodes", type=int, help="node count (default: the npz's num_nodes, "
                   "else rows of the features/labels, else max id + 1)")
    i.add_argument("--seed", type=int, default=0, help="seed of the random split, features "
                   "and generated labels")
    i.add_argument("--directed", action="store_true",
                   help="keep edges as given (default: symmetrise, drop self loops/duplicates)")
    i.add_argument("--overwrite", action="store_true", help="replace an existing staging")
    common(i)
    i.set_defaults(func=cmd_import)

    o = sub.add_parser("load-ogb", help="stage ogbn-products, ogbn-papers100M or reddit from "
                       "files already on disk (OGB / DGL layouts; nothing is downloaded)")
    o.add_argument("--name", required=True, choices=["ogbn-products", "ogbn-papers100M",
                                                     "reddit"])
    o.add_argument("--dir", required=True, help="the dataset's folder (e.g. .../ogbn_products)")
    o.add_argument("--as", dest="as_name", help="stage under this name (default: --name)")
    o.add_argument("--overwrite", action="store_true")
    common(o)
    o.set_defaults(func=cmd_load_ogb)

    t = sub.add_parser("partition", help="partition a dataset for DistDGL (reused if valid)")
    t.add_argument("name", metavar="NAME")
    t.add_argument("--parts", type=int, required=True, help="number of partitions (machines)")
    t.add_argument("--method", choices=["metis", "random"], default="metis")
    t.add_argument("--no-balance-train", dest="balance_train", action="store_false",
                   help="do not balance training nodes across partitions")
    t.add_argument("--no-balance-edges", dest="balance_edges", action="store_false",
                   help="do not balance edges across partitions")
    t.add_argument("--seed", type=int, default=0,
                   help="seed of the assignment: METIS's (seeds 0 and 1 give one cut) or, for "
                        "random, DGL's RNG; a non-zero seed gets its own folder, -seed<N>")
    t.add_argument("--feature-dtype", choices=["float32", "float16", "bfloat16"],
                   default="float32", help="dtype the partitions store (and serve) features in")
    t.add_argument("--force", action="store_true", help="repartition even if valid")
    common(t)
    t.set_defaults(func=cmd_partition)

    ls = sub.add_parser("list", help="staged datasets, presets and loaders")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common(ls)
    ls.set_defaults(func=cmd_list)


def cmd_generate(args: argparse.Namespace) -> int:
    from rudder.data.store import read_meta, stage
    from rudder.data.synthetic import PRESETS

    custom = {k: v for k, v in (("nodes", args.nodes), ("avg_degree", args.avg_degree),
                                ("communities", args.communities),
                                ("feat_dim", args.feat_dim), ("classes", args.classes))
              if v is not None}
    spec = None
    if custom:
        base = PRESETS[args.name].to_dict() if args.name in PRESETS else {}
        if "nodes" not in custom and "nodes" not in base:
            raise ValueError(f"{args.name!r} is not a preset: give --nodes for a custom graph "
                             f"(presets: {', '.join(sorted(PRESETS))})")
        spec = {**base, **custom, "seed": args.seed}
    elif args.name not in PRESETS:
        raise ValueError(f"unknown synthetic preset {args.name!r}; valid: "
                         f"{', '.join(sorted(PRESETS))} (or give --nodes for a custom graph)")
    t0 = time.perf_counter()
    d = stage(args.name, root=args.root, seed=args.seed, spec=spec, force=args.force)
    meta = read_meta(args.name, args.root) or {}
    log.info("%s: %s nodes, %s edges, %s-dim features, %s classes (%.1f s)", d,
             meta.get("nodes"), meta.get("edges"), meta.get("feat_dim"), meta.get("classes"),
             time.perf_counter() - t0)
    print(d)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from rudder.data.importers import import_edge_list, parse_split

    split, fracs = args.split, (0.6, 0.2, 0.2)
    if split is not None and not split.lower().endswith(".npz"):
        split, fracs = None, parse_split(args.split)
    d = import_edge_list(args.edges, args.name, root=args.root, features=args.features,
                         labels=args.labels, split=split, split_fracs=fracs, format=args.format,
                         num_nodes=args.num_nodes, src_col=args.src_col, dst_col=args.dst_col,
                         header=args.header, sep=args.sep, seed=args.seed,
                         symmetric=not args.directed, overwrite=args.overwrite,
                         generate_labels=args.generate_labels)
    print(d)
    return 0


def cmd_load_ogb(args: argparse.Namespace) -> int:
    from rudder.data.importers import load_dataset

    d = load_dataset(args.name, args.dir, name=args.as_name, root=args.root,
                     overwrite=args.overwrite)
    print(d)
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from rudder.data.partition import partition

    info = partition(args.name, args.parts, method=args.method,
                     balance_train=args.balance_train, balance_edges=args.balance_edges,
                     root=args.root, seed=args.seed, force=args.force,
                     feature_dtype=args.feature_dtype)
    m = info.manifest
    log.info("%s %s: edge cut %.1f%%; per partition owned/halo: %s", info.dir,
             "reused" if info.reused else "written", 100 * m["edge_cut_frac"],
             ", ".join(f"{p['owned_nodes']}/{p['halo_nodes']}" for p in m["partitions"]))
    print(info.part_config)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rudder.data.store import list_datasets

    root = Path(args.root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--root {root} is a file, not a data folder")
    if not root.exists():  # the presets still list; say why none is staged
        print(f"no data folder at {root}: nothing is staged there (rudder data generate NAME "
              f"--root {root} stages one)", file=sys.stderr)
    rows = list_datasets(args.root)
    if args.json:
        json.dump(rows, sys.stdout, indent=2, default=str)
        print()
        return 0
    header = f"{'name':<18} {'kind':<9} {'staged':<6} {'nodes':>10} {'edges':>12} " \
             f"{'feat':>5} {'classes':>7}  partitions"
    print(header)
    for r in rows:
        def num(key: str) -> str:
            v = r.get(key)
            return "-" if v is None else (f"~{v}" if not r["staged"] and key == "edges" else
                                          str(v))
        print(f"{r['name']:<18} {r['kind']:<9} {'yes' if r['staged'] else 'no':<6} "
              f"{num('nodes'):>10} {num('edges'):>12} {num('feat_dim'):>5} "
              f"{num('classes'):>7}  {' '.join(r.get('partitions', [])) or '-'}")
    return 0
