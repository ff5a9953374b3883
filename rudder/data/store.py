"""Staged datasets on disk: `<root>/<name>/graph.dgl` (dgl.save_graphs) + `meta.json`.

A dataset is staged once and reused: `meta.json` is written last (its presence marks a complete
staging), and it records the graph's content checksum, which partitions are keyed on, and the
sha256 of graph.dgl, checked before every reuse (a truncated or altered file is not staged).
A new staging is written into a hidden temporary folder and swapped in only when complete, so a
failed import (or --overwrite) leaves the previous dataset as it was. Staging is guarded by a
file lock so concurrent workflow tasks do not write the same dataset twice.

Graphs always carry ndata `feat` (float32), `label` (int64; -1 = unlabeled) and
`train_mask`/`val_mask`/`test_mask` (bool); they are symmetric and have no self loops.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from rudder.data.synthetic import PRESETS, SyntheticSpec, generate, resolve_spec
from rudder.records import read_json_object

if TYPE_CHECKING:
    import dgl

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
GRAPH_FILE = "graph.dgl"
META_FILE = "meta.json"
REQUIRED_NDATA = ("feat", "label", "train_mask", "val_mask", "test_mask")
# Real datasets: staged by `rudder data load-ogb --name N --dir DIR` (see importers.LOADERS).
LOADER_NAMES = ("ogbn-products", "ogbn-papers100M", "reddit")


def dataset_dir(name: str, root: str | os.PathLike = "data") -> Path:
    _check_name(name)
    return Path(root) / name


def _check_name(name: str) -> None:
    from rudder.config import check_name

    check_name(name, "dataset name")


STAMPS = ".verified.json"  # per folder: {file: [size, mtime_ns, sha256]} of verified files


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def check_digest(path: Path, expected: str | None, stamps_dir: Path | None = None) -> bool:
    """True when `path` has sha256 `expected`. A file verified before and unchanged since (same
    size and mtime, remembered in <stamps_dir>/.verified.json) is not hashed again: big
    partitions are reused by every run."""
    if not expected:
        return False
    try:
        st = path.stat()
    except OSError:
        return False
    stamps_path = (stamps_dir or path.parent) / STAMPS
    key = str(path.relative_to(stamps_path.parent)) if path.is_relative_to(stamps_path.parent) else str(path)
    try:
        stamps = json.loads(stamps_path.read_text())
    except (OSError, ValueError):
        stamps = {}
    if stamps.get(key) == [st.st_size, st.st_mtime_ns, expected]:
        return True
    if file_sha256(path) != expected:
        return False
    stamps[key] = [st.st_size, st.st_mtime_ns, expected]
    try:
        _atomic_write_text(stamps_path, json.dumps(stamps))
    except OSError:
        pass  # a read-only copy: verified again next time
    return True


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on `path` (created if missing); released on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def graph_checksum(g: "dgl.DGLGraph") -> str:
    """sha256 over the structure (node count, src/dst in edge order) and every ndata tensor
    (name, dtype, shape, bytes). Independent of how the file was written."""
    h = hashlib.sha256()
    h.update(f"nodes={g.num_nodes()};".encode())
    src, dst = g.edges(order="eid")
    for t in (src, dst):
        h.update(np.ascontiguousarray(t.numpy(), dtype=np.int64))
    for key in sorted(g.ndata.keys()):
        arr = g.ndata[key].contiguous().numpy()
        dtype = "uint8" if arr.dtype == np.bool_ else str(arr.dtype)  # dgl saves bool as uint8
        h.update(f";{key}:{dtype}:{arr.shape};".encode())
        h.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
    return h.hexdigest()


def _check_graph(g: "dgl.DGLGraph", what: str) -> None:
    missing = [k for k in REQUIRED_NDATA if k not in g.ndata]
    if missing:
        raise ValueError(f"{what}: graph lacks ndata {missing} (needs {list(REQUIRED_NDATA)})")
    if g.num_edges() == 0:  # e.g. an edge list of self loops only (they are removed)
        raise ValueError(f"{what}: no edges between distinct nodes ({g.num_nodes()} nodes): "
                         "nothing to sample neighbours from")
    if not bool(g.ndata["train_mask"].any()):
        raise ValueError(f"{what}: no training nodes (train_mask is all false)")


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_meta(name: str, root: str | os.PathLike = "data") -> dict[str, Any] | None:
    """meta.json of a staged dataset, or None when it is not (completely) staged."""
    path = dataset_dir(name, root) / META_FILE
    try:
        return read_json_object(path)
    except FileNotFoundError:
        return None
    except ValueError as exc:  # torn, or not an object
        log.warning("%s: treating %s as not staged", exc, name)
        return None


def is_staged(name: str, root: str | os.PathLike = "data", verify: bool = False) -> bool:
    """True when meta.json and graph.dgl exist and the file size matches the meta; with
    verify=True the graph is loaded and its checksum recomputed (slow on big graphs)."""
    meta = read_meta(name, root)
    gpath = dataset_dir(name, root) / GRAPH_FILE
    if meta is None or not gpath.exists():
        return False
    if meta.get("format_version") != FORMAT_VERSION:
        return False
    if gpath.stat().st_size != meta.get("file_bytes"):
        return False
    if meta.get("file_sha256") and not check_digest(gpath, meta["file_sha256"]):
        log.warning("%s does not match the sha256 in its meta.json (truncated or altered)", gpath)
        return False
    if verify:
        return graph_checksum(_load_file(gpath)) == meta.get("checksum")
    return True


def save_staged(g: "dgl.DGLGraph", name: str, root: str | os.PathLike = "data", *,
                source: str, seed: int | None = None,
                extra: dict[str, Any] | None = None) -> Path:
    """Write `g` as dataset `name` (graph.dgl, then meta.json). Returns the dataset folder.
    Callers hold the dataset lock (see `stage` and the importers)."""
    import dgl
    import torch

    _check_graph(g, f"dataset {name!r}")
    d = dataset_dir(name, root)
    d.mkdir(parents=True, exist_ok=True)
    # Written beside, swapped in when complete: a failure keeps the dataset that was there.
    tmpdir = Path(root) / f".{name}.tmp{os.getpid()}"
    shutil.rmtree(tmpdir, ignore_errors=True)
    tmpdir.mkdir(parents=True)
    try:
        return _save_into(g, name, d, tmpdir, source, seed, extra)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _save_into(g: "dgl.DGLGraph", name: str, d: Path, tmpdir: Path, source: str,
               seed: int | None, extra: dict[str, Any] | None) -> Path:
    import dgl
    import torch

    t0 = time.perf_counter()
    checksum = graph_checksum(g)
    gpath = tmpdir / GRAPH_FILE
    dgl.save_graphs(str(gpath), [g])
    labels = g.ndata["label"]
    labeled = labels[labels >= 0]
    meta: dict[str, Any] = {
        "name": name,
        "format_version": FORMAT_VERSION,
        "nodes": int(g.num_nodes()),
        "edges": int(g.num_edges()),
        "feat_dim": int(g.ndata["feat"].shape[1]) if g.ndata["feat"].dim() > 1 else 1,
        "classes": int(labeled.max().item()) + 1 if labeled.numel() else 0,
        "labeled": int(labeled.numel()),
        "train": int(g.ndata["train_mask"].sum()),
        "val": int(g.ndata["val_mask"].sum()),
        "test": int(g.ndata["test_mask"].sum()),
        "source": source,
        "seed": seed,
        "checksum": checksum,
        "file_bytes": gpath.stat().st_size,
        "file_sha256": file_sha256(gpath),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {"dgl": dgl.__version__, "torch": torch.__version__},
    }
    if extra:
        meta.update(extra)
    (tmpdir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    # The swap: the graph, then its meta (a reader in between sees a size/sha256 mismatch: not
    # staged, never a graph with another graph's meta).
    os.replace(gpath, d / GRAPH_FILE)
    os.replace(tmpdir / META_FILE, d / META_FILE)
    log.info("staged %s: %d nodes, %d edges -> %s (%.1f s)", name, meta["nodes"], meta["edges"],
             d / GRAPH_FILE, time.perf_counter() - t0)
    return d


def _unknown(name: str, root: str | os.PathLike) -> ValueError:
    staged = [d["name"] for d in list_datasets(root) if d["staged"]]
    return ValueError(
        f"unknown dataset {name!r}: not a synthetic preset ({', '.join(sorted(PRESETS))}), "
        f"not staged under {Path(root)}/ (staged: {', '.join(staged) or 'none'}); real datasets "
        f"({', '.join(LOADER_NAMES)}) are staged with `rudder data load-ogb --name N --dir DIR`, "
        f"edge lists with `rudder data import`")


def dataset_known(name: str, root: str | os.PathLike = "data") -> None:
    """Raises ValueError (naming the fix) unless `name` is a synthetic preset or a validly staged
    dataset under root: what a run can use, checked without staging anything."""
    _check_name(name)
    if name in PRESETS or is_staged(name, root):
        return
    if read_meta(name, root) is not None:
        raise ValueError(f"dataset {name!r} under {Path(root)}/ is damaged (graph.dgl missing, "
                         "truncated or altered since it was staged): import it again")
    raise _unknown(name, root)


def stage(name: str, root: str | os.PathLike = "data", seed: int = 0,
          spec: SyntheticSpec | dict[str, Any] | None = None, force: bool = False) -> Path:
    """Make dataset `name` available under `<root>/<name>/` and return that folder.

    - A synthetic preset (or any name with `spec`, a custom SyntheticSpec/dict) is generated
      with `seed` unless a valid staging with the same spec and seed exists (then reused).
    - Any other name must already be staged (by the importers); otherwise ValueError listing
      presets, loaders and staged names.
    """
    _check_name(name)
    d = dataset_dir(name, root)
    if spec is None and name not in PRESETS:
        dataset_known(name, root)
        return d
    resolved = resolve_spec(spec if spec is not None else name, seed)
    with file_lock(d / ".lock"):
        meta = read_meta(name, root)
        if not force and is_staged(name, root):
            if "spec" not in meta:  # imported (rudder data import / load-ogb), not generated
                raise ValueError(f"{name} in {root} holds a graph from {meta.get('source', 'an import')}, "
                                 "not a generated one: give another name, or --force to replace it")
            if meta.get("spec") == resolved.to_dict():
                log.info("reusing staged %s (%s)", name, d)
                return d
            log.warning("staged %s has another spec/seed (seed %s, asked %s): regenerating",
                        name, meta.get("seed"), resolved.seed)
        g = generate(resolved)
        source = f"synthetic:{name}" if spec is None else "synthetic:custom"
        return save_staged(g, name, root, source=source, seed=resolved.seed,
                           extra={"spec": resolved.to_dict()})


def _load_file(path: Path) -> "dgl.DGLGraph":
    import dgl

    graphs, _ = dgl.load_graphs(str(path))
    g = graphs[0]
    for key in ("train_mask", "val_mask", "test_mask"):  # dgl.save_graphs stores bool as uint8
        if key in g.ndata:
            g.ndata[key] = g.ndata[key].bool()
    return g


def load_graph(name: str, root: str | os.PathLike = "data", seed: int = 0) -> "dgl.DGLGraph":
    """The staged graph `name`; a synthetic preset not yet staged is staged first (with seed)."""
    if not is_staged(name, root):
        stage(name, root, seed=seed)
    return _load_file(dataset_dir(name, root) / GRAPH_FILE)


def list_datasets(root: str | os.PathLike = "data") -> list[dict[str, Any]]:
    """Every staged dataset under root (with its meta) and every preset not yet staged.
    Each entry: name, staged (bool), kind (synthetic|imported|loader), and meta fields."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    rootp = Path(root)
    if rootp.is_dir():
        for d in sorted(p for p in rootp.iterdir() if p.is_dir() and not p.name.startswith(".")):
            meta = read_meta(d.name, root)
            if meta is None:
                continue
            staged = is_staged(d.name, root)
            src = str(meta.get("source", ""))
            kind = "synthetic" if src.startswith("synthetic") else (
                "loader" if src in LOADER_NAMES else "imported")
            parts = sorted(p.name for p in (d / "parts").iterdir()
                           if (p / "manifest.json").exists()) if (d / "parts").is_dir() else []
            out.append({**meta, "name": d.name, "staged": staged, "kind": kind,
                        "partitions": parts})
            seen.add(d.name)
    for name, spec in PRESETS.items():
        if name not in seen:
            out.append({"name": name, "staged": False, "kind": "synthetic", "nodes": spec.nodes,
                        "edges": spec.undirected_edges * 2, "feat_dim": spec.feat_dim,
                        "classes": spec.classes, "partitions": []})
    for name in LOADER_NAMES:
        if name not in seen:
            out.append({"name": name, "staged": False, "kind": "loader", "partitions": []})
    return out
