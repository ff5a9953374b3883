"""Partition a staged dataset for DistDGL, once: `<root>/<name>/parts/<P>-<method>/`
(a suffix marks non-default balance flags or seed, see `partition_dir`).

Wraps `dgl.distributed.partition_graph` (num_hops=1, METIS -- seeded: rudder.data.metis -- or
random, balance_ntypes = train_mask so every machine gets the same number of training seeds,
return_mapping=True) and writes beside DGL's files:
- `orig_nids.pt` / `orig_eids.pt`: `orig_nids[new_id] = original id`. partition_graph
  reshuffles ids: partition p owns the contiguous new-id range `node_map[p]`, and a DistGraph
  (its ndata, features included) is indexed by NEW ids. Map with these files.
- `manifest.json` (written last; it marks a complete partitioning): the graph checksum and the
  parameters it was made with, and per partition the owned nodes, halo nodes (nodes of the
  partition graph with inner_node == False: the remote nodes a trainer there may pull), edges
  and edge cut, and the sha256 of every file of the partitioning. A partitioning whose manifest
  matches the graph and parameters and whose files match their digests is reused (a file
  verified once and unchanged since, same size and mtime, is not hashed again).

`feature_dtype` (float32, the staged graph's; float16 or bfloat16): the float32 partitioning
with its node features cast (the same cut, halos and ids: only node_feat.dgl differs, the other
files are hard links), so the servers hold and serve them in that dtype and every pulled row
moves half the bytes. The dtype is part of the params (and of the folder name: -f16 / -bf16), so
a float32 and a float16 partitioning never stand in for each other; a cast partitioning whose
structure files no longer match the float32 one's is made again.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rudder.data.metis import seeded_metis
from rudder.data.store import check_digest, dataset_dir, file_lock, file_sha256, load_graph, read_meta

log = logging.getLogger(__name__)


class _DropLines(io.TextIOBase):
    """A line-buffered text stream that forwards to `out` every line not containing `needle`."""

    def __init__(self, out, needle: str):
        self.out, self.needle, self.buf = out, needle, ""

    def write(self, text: str) -> int:
        self.buf += text
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            if self.needle not in line:
                self.out.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.buf and self.needle not in self.buf:
            self.out.write(self.buf)
        self.buf = ""
        self.out.flush()

METHODS = ("metis", "random")
# feature dtypes a partitioning may store (name -> folder suffix); float32 is the staged graph's
FEATURE_DTYPES = {"float32": "", "float16": "-f16", "bfloat16": "-bf16"}
# DGL 2.1's servers cannot put bfloat16 in shared memory ("Do not know how to handle type
# bfloat16"): its bits are stored as int16 and viewed back by the trainer (served_features)
STORED_AS = {"bfloat16": "int16"}
MANIFEST = "manifest.json"
ID_MAP = "orig_nids.pt"
EDGE_ID_MAP = "orig_eids.pt"
MANIFEST_VERSION = 2  # 2: per-file sha256 ("files")
IDS_NOTE = ("DGL reshuffles node ids: partition p owns the contiguous new-id range "
            "node_range[p]; DistGraph ndata (features, labels, masks) are indexed by these NEW "
            "ids. orig_nids.pt holds orig_nids with orig_nids[new_id] = original id (inverse: "
            "new_ids[orig_nids] = arange(nodes)); orig_eids.pt likewise for edges.")


@dataclass
class PartitionInfo:
    """Where a partitioning lives: `part_config` (DGL's `<name>.json`, what DistGraph and the
    servers load), `manifest` (the parsed manifest.json), `dir` (the partition folder)."""

    part_config: Path
    manifest: dict[str, Any]
    dir: Path
    reused: bool = field(default=False, compare=False)

    @property
    def num_parts(self) -> int:
        return int(self.manifest["params"]["num_parts"])

    @property
    def graph_name(self) -> str:
        return str(self.manifest["graph_name"])

    def orig_nids(self):
        """torch int64 tensor: orig_nids[new_id] = original node id."""
        import torch

        return torch.load(self.dir / ID_MAP, weights_only=True)

    def new_nids(self):
        """torch int64 tensor: new_nids[original id] = new (DistGraph) node id."""
        import torch

        orig = self.orig_nids()
        new = torch.empty_like(orig)
        new[orig] = torch.arange(orig.shape[0], dtype=orig.dtype)
        return new


def partition_dir(name: str, num_parts: int, method: str, root: str | os.PathLike = "data",
                  balance_train: bool = True, balance_edges: bool = True, seed: int = 0,
                  feature_dtype: str = "float32") -> Path:
    """`<root>/<name>/parts/<P>-<method>`, with a suffix for each non-default choice
    (-nobaltrain, -nobaledges, -seed<N>, -f16 / -bf16 for the feature dtype) so variants do
    not overwrite each other."""
    tag = f"{num_parts}-{method}"
    if not balance_train:
        tag += "-nobaltrain"
    if not balance_edges:
        tag += "-nobaledges"
    if seed != 0:
        tag += f"-seed{seed}"
    tag += FEATURE_DTYPES[check_feature_dtype(feature_dtype)]
    return dataset_dir(name, root) / "parts" / tag


def check_feature_dtype(name: str) -> str:
    if name not in FEATURE_DTYPES:
        raise ValueError(f"unknown feature dtype {name!r}; valid: {', '.join(FEATURE_DTYPES)}")
    return name


def _params(num_parts: int, method: str, balance_train: bool, balance_edges: bool,
            seed: int, feature_dtype: str = "float32") -> dict[str, Any]:
    # the seed of either method's assignment (METIS's: rudder.data.metis); a manifest made by
    # DGL's own unseeded METIS (seed None) is not reused
    params = {"num_parts": num_parts, "method": method, "balance_train": balance_train,
              "balance_edges": balance_edges, "num_hops": 1, "seed": seed}
    # only a cast is recorded: float32 manifests made before the option stay valid
    if check_feature_dtype(feature_dtype) != "float32":
        params["feature_dtype"] = feature_dtype
    return params


def _expected_files(d: Path, manifest: dict[str, Any]) -> list[Path]:
    files = [d / manifest["part_config"], d / ID_MAP, d / EDGE_ID_MAP]
    for p in range(int(manifest["params"]["num_parts"])):
        files += [d / f"part{p}" / f for f in ("graph.dgl", "node_feat.dgl", "edge_feat.dgl")]
    return files


def read_valid_manifest(d: Path, checksum: str, params: dict[str, Any]
                        ) -> dict[str, Any] | None:
    """The manifest in `d` if it matches the graph checksum and params and every file it names
    exists; else None (with the reason at debug level)."""
    try:
        manifest = json.loads((d / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        log.warning("%s is corrupt: repartitioning", d / MANIFEST)
        return None
    if manifest.get("format_version") != MANIFEST_VERSION:
        log.info("%s: old manifest format: repartitioning", d)
        return None
    if manifest.get("graph_checksum") != checksum:
        log.info("%s: the graph changed since it was partitioned: repartitioning", d)
        return None
    if manifest.get("params") != params:
        log.info("%s: made with %s, asked %s: repartitioning", d, manifest.get("params"), params)
        return None
    missing = [str(f) for f in _expected_files(d, manifest) if not f.exists()]
    if missing:
        log.info("%s: files missing (%s): repartitioning", d, ", ".join(missing[:3]))
        return None
    digests = manifest.get("files") or {}
    bad = [rel for rel in map(lambda f: str(f.relative_to(d)), _expected_files(d, manifest))
           if not check_digest(d / rel, digests.get(rel), d)]
    if bad:
        log.warning("%s: %s differ from the manifest's sha256 (truncated or altered): "
                    "repartitioning", d, ", ".join(bad[:3]))
        return None
    return manifest


def partition(name: str, num_parts: int, method: str = "metis", balance_train: bool = True,
              balance_edges: bool = True, root: str | os.PathLike = "data", seed: int = 0,
              force: bool = False, feature_dtype: str = "float32") -> PartitionInfo:
    """Partition dataset `name` (staged, or a synthetic preset, staged on demand) into
    `num_parts` parts for DistDGL; reuse an existing valid partitioning unless force=True.
    `seed` seeds the assignment (METIS's, or DGL's RNG for random: either way the same graph,
    parts and seed give the same partitioning anywhere); `feature_dtype` is the dtype the
    partitions store (and the servers serve) the node features in."""
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}; valid: {list(METHODS)}")
    if not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts must be a positive integer, got {num_parts!r}")
    params = _params(num_parts, method, bool(balance_train), bool(balance_edges), seed,
                     feature_dtype)
    d = partition_dir(name, num_parts, method, root, params["balance_train"],
                      params["balance_edges"], seed, feature_dtype)
    if feature_dtype != "float32":  # the float32 partitioning, its features cast
        return _cast_partitioning(name, d, params, root, force)
    meta = read_meta(name, root)
    if meta is not None and not force:  # fast path: no graph load, no lock
        manifest = read_valid_manifest(d, meta["checksum"], params)
        if manifest is not None:
            log.info("reusing partition %s", d)
            return PartitionInfo(d / manifest["part_config"], manifest, d, reused=True)

    g = load_graph(name, root)  # stages a preset (seed 0) if needed
    meta = read_meta(name, root)
    assert meta is not None
    if num_parts > g.num_nodes():
        raise ValueError(f"{name}: cannot cut {g.num_nodes()} nodes into {num_parts} parts")
    with file_lock(d.parent / f".lock-{d.name}"):
        if not force:  # another process may have finished it while we waited
            manifest = read_valid_manifest(d, meta["checksum"], params)
            if manifest is not None:
                log.info("reusing partition %s", d)
                return PartitionInfo(d / manifest["part_config"], manifest, d, reused=True)
        manifest = _run_partition(g, name, d, params, meta["checksum"])
    return PartitionInfo(d / manifest["part_config"], manifest, d, reused=False)


def _cast_partitioning(name: str, d: Path, params: dict[str, Any], root, force: bool
                       ) -> PartitionInfo:
    """The float32 partitioning (made or reused) with only its node features cast: the same
    nodes, halos and ids (no second partitioning: a dtype is compared on the very same
    files). Valid while its structure files match the float32 one's."""
    base_params = {k: v for k, v in params.items() if k != "feature_dtype"}
    base = partition(name, base_params["num_parts"], base_params["method"],
                     base_params["balance_train"], base_params["balance_edges"], root,
                     base_params["seed"], force)
    checksum = base.manifest["graph_checksum"]

    def reusable() -> dict[str, Any] | None:
        m = None if force else read_valid_manifest(d, checksum, params)
        dtype = params["feature_dtype"]
        same = m is not None and m.get("feature_stored_as") == STORED_AS.get(dtype, dtype) and all(
            m["files"].get(k) == v for k, v in base.manifest["files"].items()
            if not k.endswith("node_feat.dgl"))
        return m if same else None

    manifest = reusable()
    if manifest is not None:
        log.info("reusing partition %s", d)
        return PartitionInfo(d / manifest["part_config"], manifest, d, reused=True)
    with file_lock(d.parent / f".lock-{d.name}"):
        manifest = reusable() or _write_cast(base, d, params, name)
    return PartitionInfo(d / manifest["part_config"], manifest, d, reused=False)


def _write_cast(base: PartitionInfo, d: Path, params: dict[str, Any], name: str
                ) -> dict[str, Any]:
    import dgl
    import torch

    dtype = params["feature_dtype"]
    for stale in d.parent.glob(d.name + ".tmp*"):  # left by a crashed run (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    manifest = json.loads(json.dumps(base.manifest))
    files, row_bytes = manifest["files"], None
    for rel in files:  # structure files: hard links where the filesystem allows (never edited)
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith("node_feat.dgl"):
            feats = dgl.data.utils.load_tensors(str(base.dir / rel))
            keys = [k for k in feats if k.endswith("/feat") or k == "feat"]
            if not keys:
                raise RuntimeError(f"{base.dir / rel} holds no node features 'feat'")
            for key in keys:
                feats[key] = cast_features(feats[key], dtype, name)
                row_bytes = feats[key][:1].numel() * feats[key].element_size()
                if dtype in STORED_AS:  # the same bits in a dtype the servers can hold
                    feats[key] = feats[key].view(getattr(torch, STORED_AS[dtype]))
            dgl.data.utils.save_tensors(str(tmp / rel), feats)
            files[rel] = file_sha256(tmp / rel)
            continue
        try:
            os.link(base.dir / rel, tmp / rel)
        except OSError:
            shutil.copy2(base.dir / rel, tmp / rel)
    manifest.update(params=params, feature_dtype=dtype, feature_row_bytes=row_bytes,
                    feature_stored_as=STORED_AS.get(dtype, dtype),
                    cast_from=f"{base.dir.name} (float32)",
                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    log.info("partition %s: %s with its features cast to %s", d, base.dir.name, dtype)
    return manifest


def _run_partition(g, name: str, d: Path, params: dict[str, Any], checksum: str
                   ) -> dict[str, Any]:
    import dgl
    import torch

    num_parts, method = params["num_parts"], params["method"]
    for stale in d.parent.glob(d.name + ".tmp*"):  # left by a crashed run (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    dgl.random.seed(params["seed"])
    log.info("partitioning %s (%d nodes, %d edges) into %d parts with %s ...", name,
             g.num_nodes(), g.num_edges(), num_parts, method)
    # DGL reports progress with print(): keep stdout clean for callers that parse it, and drop
    # its "... 0 edge cuts ..." line (wrong: it counts halo edges; the log below has the cut).
    seeded = seeded_metis(params["seed"]) if method == "metis" else contextlib.nullcontext()
    with seeded, contextlib.redirect_stdout(_DropLines(sys.stderr, "edge cuts for")):
        orig_nids, orig_eids = dgl.distributed.partition_graph(
            g, graph_name=name, num_parts=num_parts, out_path=str(tmp), num_hops=1,
            part_method=method,
            balance_ntypes=g.ndata["train_mask"] if params["balance_train"] else None,
            balance_edges=params["balance_edges"], return_mapping=True)
    seconds = time.perf_counter() - t0
    orig_nids = torch.as_tensor(orig_nids, dtype=torch.int64)
    orig_eids = torch.as_tensor(orig_eids, dtype=torch.int64)
    torch.save(orig_nids, tmp / ID_MAP)
    torch.save(orig_eids, tmp / EDGE_ID_MAP)

    part_config = f"{name}.json"
    config = json.loads((tmp / part_config).read_text())
    ranges = _node_ranges(config, num_parts)
    train_new = g.ndata["train_mask"][orig_nids]
    parts = []
    for p in range(num_parts):
        pg = dgl.load_graphs(str(tmp / f"part{p}" / "graph.dgl"))[0][0]
        inner = pg.ndata["inner_node"].bool()
        src, dst = pg.edges()
        inner_e = pg.edata["inner_edge"].bool()
        owned = int(inner.sum())
        lo, hi = ranges[p]
        if owned != hi - lo:
            raise RuntimeError(f"partition {p}: {owned} inner nodes but node_map range "
                               f"{lo}..{hi}")
        parts.append({
            "part_id": p,
            "owned_nodes": owned,
            "halo_nodes": int(pg.num_nodes() - owned),
            "nodes": int(pg.num_nodes()),
            "edges": int(pg.num_edges()),
            "inner_edges": int(inner_e.sum()),
            # edges into an owned node from a node owned elsewhere (count each direction)
            "edge_cut": int((inner[dst] & ~inner[src]).sum()),
            "train_nodes": int(train_new[lo:hi].sum()),
            "node_range": [lo, hi],
        })
    edge_cut = sum(p["edge_cut"] for p in parts)
    manifest = {
        "format_version": MANIFEST_VERSION,
        "dataset": name,
        "graph_name": name,
        "graph_checksum": checksum,
        "params": params,
        "part_config": part_config,
        "id_map": ID_MAP,
        "edge_id_map": EDGE_ID_MAP,
        "ids": IDS_NOTE,
        "num_nodes": int(g.num_nodes()),
        "num_edges": int(g.num_edges()),
        # what the servers serve: bytes per pulled row = feat_dim x the dtype's size
        "feature_dtype": str(g.ndata["feat"].dtype).removeprefix("torch."),
        "feature_row_bytes": int(g.ndata["feat"][:1].numel() * g.ndata["feat"].element_size()),
        "edge_cut": edge_cut,
        "edge_cut_frac": edge_cut / max(1, g.num_edges()),
        "halo_nodes": sum(p["halo_nodes"] for p in parts),
        "partitions": parts,
        "seconds": round(seconds, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {"dgl": dgl.__version__, "torch": torch.__version__},
    }
    manifest["files"] = {str(f.relative_to(tmp)): file_sha256(f)
                         for f in _expected_files(tmp, manifest)}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    log.info("partitioned %s into %d (%s) in %.1f s: edge cut %.1f%%, halo nodes %s", name,
             num_parts, method, seconds, 100 * manifest["edge_cut_frac"],
             [p["halo_nodes"] for p in parts])
    return manifest


class FeatureBits:
    """A DistTensor of features stored as other bits (bfloat16 as int16), seen in its dtype:
    `feats[ids]` pulls the stored rows (the same bytes) and views them, no copy."""

    def __init__(self, stored, dtype):
        self.stored, self.dtype = stored, dtype
        self.shape = stored.shape

    def __getitem__(self, ids):
        return self.stored[ids].view(self.dtype)

    def __len__(self) -> int:
        return int(self.shape[0])


def served_features(feat, feature_dtype: str):
    """The trainer's view of the servers' feature tensor for `feature_dtype`: the tensor itself,
    or (bfloat16 stored as int16) a FeatureBits view; RuntimeError if the servers hold another
    dtype (a partitioning of another dtype would mislabel every byte count)."""
    import torch

    served = str(feat.dtype).removeprefix("torch.")
    if served == STORED_AS.get(feature_dtype, feature_dtype):
        return FeatureBits(feat, getattr(torch, feature_dtype)) if feature_dtype in STORED_AS else feat
    raise RuntimeError(f"the servers hold {served} features, dataset.feature_dtype is {feature_dtype}")


def cast_features(feat, dtype: str, name: str = "features"):
    """`feat` cast to `dtype` (round to nearest); ValueError if a finite value does not fit
    (float16 tops out at 65504) instead of silently serving inf."""
    import torch

    out = feat.to(getattr(torch, check_feature_dtype(dtype)))
    bad = torch.isfinite(feat) & ~torch.isfinite(out)
    if bad.any():
        raise ValueError(f"{name}: {int(bad.sum())} feature values overflow {dtype} (largest "
                         f"|value| {float(feat[bad].abs().max()):g}); use float32 or bfloat16")
    return out


def _node_ranges(config: dict[str, Any], num_parts: int) -> list[tuple[int, int]]:
    node_map = config["node_map"]
    if isinstance(node_map, dict):
        node_map = next(iter(node_map.values()))
    arr = np.asarray(node_map, dtype=np.int64)
    if arr.ndim == 1:  # old format: only the ends
        arr = np.stack([np.concatenate([[0], arr[:-1]]), arr], axis=1)
    if arr.shape[0] != num_parts:
        raise RuntimeError(f"node_map has {arr.shape[0]} ranges for {num_parts} parts")
    return [(int(a), int(b)) for a, b in arr]


def list_partitions(name: str, root: str | os.PathLike = "data") -> list[PartitionInfo]:
    """Every complete partitioning of `name` (manifest present), valid or not."""
    base = dataset_dir(name, root) / "parts"
    out = []
    if base.is_dir():
        for d in sorted(base.iterdir()):
            mpath = d / MANIFEST
            if d.is_dir() and mpath.exists() and ".tmp" not in d.name:
                manifest = json.loads(mpath.read_text())
                out.append(PartitionInfo(d / manifest["part_config"], manifest, d, reused=True))
    return out
