"""Import real graphs into the staged format (see store.py).

- `import_edge_list`: an edge list plus optional features, labels and split files. Text edge
  lists as users have them: CSV with a `src,dst` header, or SNAP/KONECT style (`#` / `%`
  comment lines, tab or whitespace separated, no header, extra columns such as weights
  ignored); columns by name or position; Parquet; npz (arrays src, dst or edge_index, and
  `num_nodes` if present). Labels absent is an error unless generated labels are asked for
  (`generate_labels`, see `generated_labels`).
- Loaders for public datasets in their own on-disk layouts, for machines that have the files
  (nothing is downloaded here): ogbn-products and ogbn-papers100M (OGB layout) and Reddit (DGL
  layout). `LOADERS` maps each name to its function.

Every graph is made symmetric without self loops or duplicate edges (as DistDGL's GraphSAGE
examples use them). Bad input raises ValueError / FileNotFoundError naming the file and the
problem.
"""
from __future__ import annotations

import logging
import os
import re
import time
import zipfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rudder.data.store import dataset_dir, file_lock, is_staged, save_staged

# what numpy raises for a file it cannot read as .npy/.npz (truncated, not a zip, pickled objects)
_UNREADABLE = (ValueError, OSError, EOFError, zipfile.BadZipFile)


def _open_npz(p: str | os.PathLike, what: str):
    """np.load of an .npz holding `what`; one numpy cannot open is an error naming it."""
    try:
        return np.load(p, allow_pickle=False)
    except _UNREADABLE as exc:
        raise ValueError(f"{p}: cannot read {what} as npz: {exc}") from None

log = logging.getLogger(__name__)

EDGE_FORMATS = ("csv", "parquet", "npz")
COMMENT_CHARS = ("#", "%")  # SNAP and KONECT comment lines
GENERATED_CLASSES = 8  # classes of generated labels


# ----------------------------------------------------------------------------- readers

def _need_file(path: str | os.PathLike, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} file not found: {p}")
    return p


def _infer_format(path: Path) -> str:
    name = path.name.lower()
    for suffix in (".gz", ".bz2", ".zst", ".xz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.endswith((".csv", ".tsv", ".txt")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".npz"):
        return "npz"
    if name.endswith(".npy"):
        return "npy"
    # SNAP/KONECT files come as .edges, .el, out.<name>, ...: read as text
    return "csv"


def _read_csv(path: Path, header: bool = True):
    import pandas as pd

    sep = "\t" if ".tsv" in path.name.lower() else ","
    try:
        return pd.read_csv(path, sep=sep, header=0 if header else None, engine="c",
                           low_memory=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot parse as CSV: {exc}") from None


def _as_ids(values: Any, path: Path, column: str) -> np.ndarray:
    """A column of node ids -> int64 array; non-integer or negative ids are errors."""
    arr = np.asarray(values)
    if arr.dtype == object or arr.dtype.kind in "USb":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            bad = next((v for v in arr.ravel() if not _is_int_like(v)), None)
            raise ValueError(f"{path}: column {column!r} has non-integer node ids "
                             f"(e.g. {bad!r})") from None
    if arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        if not finite.all():
            raise ValueError(f"{path}: column {column!r} has missing/non-finite node ids "
                             f"(first at row {int(np.argmin(finite))})")
        if not np.array_equal(arr, np.floor(arr)):
            row = int(np.argmax(arr != np.floor(arr)))
            raise ValueError(f"{path}: column {column!r} has non-integer node ids "
                             f"(e.g. {arr[row]!r} at row {row})")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"{path}: column {column!r} has non-integer node ids "
                         f"(dtype {arr.dtype})")
    # an id past int64 (1e20, or a uint64 above 2^63) would wrap to a negative one in the cast
    too_big = arr >= 2.0 ** 63 if arr.dtype.kind == "f" else arr > np.iinfo(np.int64).max
    if arr.size and too_big.any():
        row = int(np.argmax(too_big))
        raise ValueError(f"{path}: column {column!r} has node ids too large for int64 "
                         f"(e.g. {arr[row]:.0f} at row {row})")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        row = int(np.argmin(arr))
        raise ValueError(f"{path}: column {column!r} has negative node ids "
                         f"(e.g. {arr[row]} at row {row})")
    return arr


def _is_int_like(v: Any) -> bool:
    try:
        return float(v) == int(float(v))
    except (TypeError, ValueError):
        return False


def _open_text(p: Path):
    import bz2
    import gzip
    import lzma

    name = p.name.lower()
    opener = (gzip.open if name.endswith(".gz") else bz2.open if name.endswith(".bz2") else
              lzma.open if name.endswith(".xz") else open)
    return opener(p, "rt", errors="replace")


def sniff_text(p: Path, max_lines: int = 200) -> dict:
    """How a text edge list is laid out, from its first lines: `skip` (leading comment or blank
    lines: `#` SNAP, `%` KONECT), `sep` (tab, comma, else any whitespace) and `header` (True
    when the first data line is not two integers)."""
    skip, first = 0, None
    with _open_text(p) as f:
        for i, line in enumerate(f):
            if i >= max_lines:
                break
            stripped = line.strip()
            if not stripped or stripped.startswith(COMMENT_CHARS):
                skip += 1
                continue
            first = line.rstrip("\r\n")
            break
    if first is None:
        raise ValueError(f"{p}: no edges (only comments or blank lines in the first "
                         f"{max_lines} lines)")
    sep = "\t" if "\t" in first else "," if "," in first else r"\s+"
    fields = [x for x in re.split(sep, first.strip()) if x != ""]
    header = not (len(fields) >= 2 and all(_is_int_like(x) for x in fields[:2]))
    return {"skip": skip, "sep": sep, "header": header}


def _column(df, col: str | int, p: Path):
    """A column by name, or by 0-based position (an int, or digits when the file has no
    header)."""
    if col in df.columns:
        return df[col].to_numpy()
    if isinstance(col, int) or str(col).isdigit():
        i = int(col)
        if i < df.shape[1]:
            return df.iloc[:, i].to_numpy()
        raise ValueError(f"{p}: column {i} does not exist (the file has {df.shape[1]})")
    raise ValueError(f"{p}: missing column {col!r} (found: {list(map(str, df.columns))}); "
                     "name the columns with --src-col/--dst-col, or give positions (0, 1)")


def read_edge_list(path: str | os.PathLike, format: str | None = None,
                   src_col: str | int = "src", dst_col: str | int = "dst", *,
                   header: bool | None = None, sep: str | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) int64 arrays from a text edge list, Parquet (columns src_col, dst_col) or npz
    (arrays named src_col, dst_col, or one (2, E) array `edge_index`).

    Text: leading `#` / `%` comment lines are skipped; `sep` (default: tab, comma or any
    whitespace, from the first data line) and `header` (default: a first data line that is not
    two integers is a header) are sniffed unless given. With a header the columns are found by
    name (src_col, dst_col); without one, `src`/`dst` mean the first two columns, and digits
    name a column by position. Columns beyond those two (weights, timestamps) are ignored."""
    p = _need_file(path, "edge list")
    fmt = (format or _infer_format(p)).lower()
    if fmt not in EDGE_FORMATS:
        raise ValueError(f"{p}: unknown edge-list format {fmt!r}; valid: {EDGE_FORMATS}")
    if fmt == "npz":
        with _open_npz(p, "an edge list") as z:
            if src_col in z.files and dst_col in z.files:
                src, dst = z[src_col], z[dst_col]
            elif "edge_index" in z.files:
                ei = z["edge_index"]
                if ei.ndim != 2 or ei.shape[0] != 2:
                    raise ValueError(f"{p}: edge_index must have shape (2, E), got {ei.shape}")
                src, dst = ei[0], ei[1]
            else:
                missing = [c for c in (src_col, dst_col) if c not in z.files]
                raise ValueError(f"{p}: missing array(s) {missing} (found: {z.files})")
    else:
        if fmt == "csv":
            df, has_header = _read_text_edges(p, header, sep)
            if not has_header:  # the default names mean the first two columns
                src_col = 0 if src_col == "src" else src_col
                dst_col = 1 if dst_col == "dst" else dst_col
        else:
            import pyarrow  # noqa: F401  (a clear ImportError if absent)
            import pandas as pd

            try:
                df = pd.read_parquet(p)
            except Exception as exc:  # pyarrow raises several types for bad files
                raise ValueError(f"{p}: cannot read as Parquet: {exc}") from None
        missing = [c for c in (src_col, dst_col)
                   if c not in df.columns and not (fmt == "csv" and str(c).isdigit())]
        if missing:
            raise ValueError(f"{p}: missing column(s) {missing} (found: "
                             f"{list(map(str, df.columns))}); name them with --src-col/"
                             "--dst-col (or positions 0, 1)")
        src, dst = _column(df, src_col, p), _column(df, dst_col, p)
    src = _as_ids(np.asarray(src).ravel(), p, src_col)
    dst = _as_ids(np.asarray(dst).ravel(), p, dst_col)
    if src.shape != dst.shape:
        raise ValueError(f"{p}: {src_col} and {dst_col} differ in length "
                         f"({src.shape[0]} vs {dst.shape[0]})")
    if not src.size:
        raise ValueError(f"{p}: no edges (nothing after the header and comments)")
    return src, dst


def _read_text_edges(p: Path, header: bool | None, sep: str | None):
    """A text edge list as a DataFrame (comments skipped, separator and header sniffed unless
    given); returns (frame, has_header)."""
    import pandas as pd

    layout = sniff_text(p)
    has_header = layout["header"] if header is None else header
    named = {"tab": "\t", "\\t": "\t", "space": r"\s+", "whitespace": r"\s+"}
    if sep is not None and sep not in named and len(sep) != 1:
        raise ValueError(f"sep {sep!r}: give tab, space (any whitespace) or one character such as ,")
    sep = layout["sep"] if sep is None else named.get(sep, sep)
    try:
        df = pd.read_csv(p, sep=sep, header=0 if has_header else None, skiprows=layout["skip"],
                         comment=None, engine="python" if sep == r"\s+" else "c",
                         skipinitialspace=True, dtype=None if has_header else str)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: cannot parse as an edge list: {exc}") from None
    df = df.loc[:, [c for c in df.columns if not str(c).startswith("Unnamed")] or df.columns]
    if has_header:
        df.columns = [str(c).strip().lstrip("#%").strip() for c in df.columns]
    else:  # drop comment lines further down (SNAP files sometimes have them mid-file)
        first = df.iloc[:, 0].astype(str)
        df = df[~first.str.startswith(COMMENT_CHARS)]
    return df, has_header


def _read_matrix(path: str | os.PathLike, what: str, keys: Sequence[str]) -> np.ndarray:
    """An array from .npy, .npz (first of `keys` present, else the only array), .csv (all
    columns, header row) or .parquet (all columns)."""
    p = _need_file(path, what)
    fmt = _infer_format(p)
    if fmt == "npy":
        try:
            return np.load(p, allow_pickle=False)
        except _UNREADABLE as exc:
            raise ValueError(f"{p}: cannot read {what} as npy: {exc}") from None
    if fmt == "npz":
        with _open_npz(p, what) as z:
            for key in keys:
                if key in z.files:
                    return z[key]
            if len(z.files) == 1:
                return z[z.files[0]]
            raise ValueError(f"{p}: no {what} array; expected one of {list(keys)} "
                             f"(found: {z.files})")
    if fmt == "csv":
        df = _read_csv(p)
    else:
        import pandas as pd

        try:
            df = pd.read_parquet(p)
        except Exception as exc:
            raise ValueError(f"{p}: cannot read {what} as Parquet: {exc}") from None
    if "node_id" in df.columns:  # rows in any order, placed by node id
        ids = _as_ids(df["node_id"].to_numpy(), p, "node_id")
        df = df.drop(columns=["node_id"])
        order = np.argsort(ids, kind="stable")
        if not np.array_equal(ids[order], np.arange(ids.shape[0])):
            raise ValueError(f"{p}: node_id must list every node 0..{ids.shape[0] - 1} once")
        df = df.iloc[order]
    try:
        return df.to_numpy(dtype=np.float64 if what == "labels" else np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{p}: {what} must be numeric: {exc}") from None


def read_features(path: str | os.PathLike, num_nodes: int | None = None) -> np.ndarray:
    p = Path(path)
    feat = _read_matrix(p, "features", ("feat", "features", "feature", "node_feat", "x"))
    if feat.ndim == 1:
        feat = feat[:, None]
    if feat.ndim != 2:
        raise ValueError(f"{p}: features must be 2-D (nodes x dim), got shape {feat.shape}")
    if feat.dtype.kind not in "fiub":
        raise ValueError(f"{p}: features must be numeric, got dtype {feat.dtype}")
    if num_nodes is not None and feat.shape[0] != num_nodes:
        raise ValueError(f"{p}: features have {feat.shape[0]} rows but the graph has "
                         f"{num_nodes} nodes")
    feat = feat.astype(np.float32, copy=False)
    if not np.isfinite(feat).all():
        raise ValueError(f"{p}: features contain NaN or infinite values")
    return feat


def read_labels(path: str | os.PathLike, num_nodes: int | None = None) -> np.ndarray:
    """int64 labels; NaN (or negative) entries become -1 (unlabeled)."""
    p = Path(path)
    lab = _read_matrix(p, "labels", ("label", "labels", "node_label", "y"))
    if lab.ndim == 2 and lab.shape[1] == 1:
        lab = lab[:, 0]
    if lab.ndim != 1:
        raise ValueError(f"{p}: labels must be one column, got shape {lab.shape}")
    if num_nodes is not None and lab.shape[0] != num_nodes:
        raise ValueError(f"{p}: labels have {lab.shape[0]} rows but the graph has "
                         f"{num_nodes} nodes")
    return _labels_to_int(lab, p)


def _labels_to_int(lab: np.ndarray, p: Path | str) -> np.ndarray:
    if lab.dtype.kind == "f":
        nan = ~np.isfinite(lab)
        filled = np.where(nan, -1, lab)
        if not np.array_equal(filled, np.floor(filled)):
            raise ValueError(f"{p}: labels must be integer class ids (or NaN for unlabeled)")
        lab = filled
    elif lab.dtype.kind not in "iub":
        raise ValueError(f"{p}: labels must be integer class ids, got dtype {lab.dtype}")
    lab = lab.astype(np.int64)
    lab[lab < 0] = -1
    return lab


def read_split(path: str | os.PathLike, num_nodes: int) -> tuple[np.ndarray, ...]:
    """(train, val, test) bool masks from an npz holding train/val(or valid)/test arrays, each
    either a bool mask of length num_nodes or an index array."""
    p = _need_file(path, "split")
    z = _open_npz(p, "split")
    masks = []
    with z:
        for names in (("train", "train_idx", "train_mask"),
                      ("val", "valid", "val_idx", "valid_idx", "val_mask"),
                      ("test", "test_idx", "test_mask")):
            key = next((k for k in names if k in z.files), None)
            if key is None:
                raise ValueError(f"{p}: missing split array {names[0]!r} (found: {z.files})")
            masks.append(_to_mask(z[key], num_nodes, f"{p}[{key}]"))
    _check_disjoint(masks, p)
    return tuple(masks)


def _to_mask(arr: np.ndarray, num_nodes: int, what: str) -> np.ndarray:
    arr = np.asarray(arr).ravel()
    if arr.dtype == bool:
        if arr.shape[0] != num_nodes:
            raise ValueError(f"{what}: mask has length {arr.shape[0]}, graph has "
                             f"{num_nodes} nodes")
        return arr.copy()
    idx = _as_ids(arr, Path(what), "index")
    if idx.size and idx.max() >= num_nodes:
        raise ValueError(f"{what}: index {int(idx.max())} out of range for {num_nodes} nodes")
    mask = np.zeros(num_nodes, dtype=bool)
    mask[idx] = True
    return mask


def _check_disjoint(masks: Sequence[np.ndarray], where: Any) -> None:
    overlap = (masks[0].astype(np.int8) + masks[1] + masks[2]) > 1
    if overlap.any():
        raise ValueError(f"{where}: train/val/test overlap on {int(overlap.sum())} nodes "
                         f"(e.g. node {int(np.argmax(overlap))})")


def random_split(labels: np.ndarray, fracs: Sequence[float] = (0.6, 0.2, 0.2),
                 seed: int = 0) -> tuple[np.ndarray, ...]:
    """Disjoint train/val/test masks over the labeled nodes (label >= 0), by seed."""
    if len(fracs) != 3 or min(fracs) < 0 or sum(fracs) > 1 + 1e-9:
        raise ValueError(f"split fractions {tuple(fracs)}: need three values >= 0, sum <= 1")
    n = labels.shape[0]
    cand = np.flatnonzero(labels >= 0)
    cand = cand[np.random.default_rng(seed).permutation(cand.shape[0])]
    counts = [int(round(f * cand.shape[0])) for f in fracs]
    bounds = np.cumsum([0] + counts)
    masks = []
    for i in range(3):
        m = np.zeros(n, dtype=bool)
        m[cand[bounds[i]:min(bounds[i + 1], cand.shape[0])]] = True
        masks.append(m)
    return tuple(masks)


# ----------------------------------------------------------------------------- building

def symmetrize(src: np.ndarray, dst: np.ndarray, num_nodes: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of every edge, without self loops or duplicates (sorted by src)."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    u = np.concatenate([src, dst])
    v = np.concatenate([dst, src])
    keys = np.unique(u * np.int64(num_nodes) + v)
    return keys // num_nodes, keys % num_nodes


def build_and_stage(src: np.ndarray, dst: np.ndarray, *, name: str, root: str | os.PathLike,
                    num_nodes: int, feat: np.ndarray | None, labels: np.ndarray | None,
                    masks: tuple[np.ndarray, ...] | None, source: str, seed: int = 0,
                    split_fracs: Sequence[float] = (0.6, 0.2, 0.2), make_symmetric: bool = True,
                    placeholder_feat_dim: int = 16, extra: dict[str, Any] | None = None,
                    generate_labels: bool = False) -> Path:
    """Common tail of every importer: check, fill placeholders, symmetrise, stage. Labels
    absent: an error, unless generate_labels (then `generated_labels`)."""
    from rudder.data.synthetic import arrays_to_graph

    placeholders = []
    if src.size and max(int(src.max()), int(dst.max())) >= num_nodes:
        raise ValueError(f"{source}: node id {max(int(src.max()), int(dst.max()))} is out of "
                         f"range for {num_nodes} nodes")
    if feat is None:
        # No features given: seeded Gaussian noise so the pipeline runs (accuracy meaningless).
        log.warning("%s: no features given; using random %d-dim features", name,
                    placeholder_feat_dim)
        feat = np.random.default_rng(seed).standard_normal((num_nodes, placeholder_feat_dim),
                                                           dtype=np.float32)
        placeholders.append("feat")
    if labels is None and not generate_labels:
        raise ValueError(f"{source}: no labels given. Pass a labels file (--labels), or ask for "
                         "generated labels (--generate-labels: classes made from the graph, "
                         "so accuracy only shows that training learns, not that it means "
                         "anything)")
    if make_symmetric:
        src, dst = symmetrize(src, dst, num_nodes)
    if labels is None:
        labels = generated_labels(src, dst, num_nodes, feat, seed=seed)
        log.warning("%s: generated labels: %d classes from the mean of each node's neighbours' "
                    "features (see generated_labels)", name, GENERATED_CLASSES)
        placeholders.append("label")
    present = np.unique(labels[labels >= 0])
    if present.size == 1:
        log.warning("%s: every labeled node has class %d: runs will not report accuracy", name,
                    int(present[0]))
    if masks is None:
        masks = random_split(labels, split_fracs, seed)
        split_source = f"random{tuple(split_fracs)}"
    else:
        split_source = "given"
    g = arrays_to_graph(src, dst, num_nodes, {
        "feat": feat, "label": labels, "train_mask": masks[0], "val_mask": masks[1],
        "test_mask": masks[2]})
    info = {"split": split_source, "symmetrized": make_symmetric,
            "classes_present": int(present.size)}
    if placeholders:
        info["placeholders"] = placeholders
    if extra:
        info.update(extra)
    return save_staged(g, name, root, source=source, seed=seed, extra=info)


def generated_labels(src: np.ndarray, dst: np.ndarray, num_nodes: int, feat: np.ndarray,
                     classes: int = GENERATED_CLASSES, seed: int = 0) -> np.ndarray:
    """Labels for a graph that has none: class = argmax of a seeded random linear map of the
    mean of the node's in-neighbours' features (its own where it has none). One GraphSAGE layer
    can learn that, so accuracy shows that training works; it says nothing about the data."""
    import scipy.sparse as sp

    deg = np.bincount(dst, minlength=num_nodes).astype(np.float32)
    adj = sp.csr_matrix((np.ones(src.size, dtype=np.float32), (dst, src)),
                        shape=(num_nodes, num_nodes))
    mean = adj @ feat / np.maximum(deg, 1.0)[:, None]
    mean[deg == 0] = feat[deg == 0]
    w = np.random.default_rng(seed + 1).standard_normal((feat.shape[1], classes))
    return np.asarray(mean @ w).argmax(1).astype(np.int64)


def parse_split(text: str) -> tuple[float, float, float]:
    """"0.8,0.1,0.1" -> (0.8, 0.1, 0.1): train, val, test shares of the labeled nodes."""
    try:
        fr = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--split {text!r}: expected three fractions like 0.8,0.1,0.1 or an "
                         ".npz file of masks") from None
    if len(fr) != 3 or min(fr) < 0 or sum(fr) > 1 + 1e-9 or fr[0] <= 0:
        raise ValueError(f"--split {text!r}: need train,val,test fractions >= 0 (train > 0) "
                         "summing to at most 1")
    return fr  # type: ignore[return-value]


def npz_num_nodes(path: str | os.PathLike) -> int | None:
    """The `num_nodes` scalar of an npz edge list, if it holds one."""
    with _open_npz(path, "an edge list") as z:
        if "num_nodes" not in z.files:
            return None
        return int(np.asarray(z["num_nodes"]).ravel()[0])


def import_edge_list(path: str | os.PathLike, name: str, root: str | os.PathLike = "data",
                     features: str | os.PathLike | None = None,
                     labels: str | os.PathLike | None = None,
                     split: str | os.PathLike | None = None, *, format: str | None = None,
                     num_nodes: int | None = None, src_col: str | int = "src",
                     dst_col: str | int = "dst", header: bool | None = None,
                     sep: str | None = None, split_fracs: Sequence[float] = (0.6, 0.2, 0.2),
                     seed: int = 0, symmetric: bool = True, overwrite: bool = False,
                     generate_labels: bool = False) -> Path:
    """Stage an edge list as dataset `name` under `<root>/<name>/`; returns that folder.

    path: a text edge list (CSV with a src,dst header, or SNAP/KONECT: `#`/`%` comments, tab or
    whitespace separated, no header; see read_edge_list for header/sep/columns), Parquet
    (columns src,dst) or npz (arrays src,dst or edge_index; its `num_nodes`, if present, sets
    the node count); format overrides the guess from the file name. num_nodes defaults to the
    npz's, else the feature/label row count, else max id + 1. features: npy/npz/csv/parquet,
    one row per node (a `node_id` column orders csv/parquet rows). labels: same formats, one value per node;
    NaN or negative = unlabeled (-1). split: npz with train, val (or valid), test as masks or
    index arrays; absent -> random split of the labeled nodes by split_fracs and seed.
    Labels absent: ValueError, unless generate_labels (see generated_labels).
    An existing staging of `name` is kept unless overwrite=True.
    """
    d = dataset_dir(name, root)
    with file_lock(d / ".lock"):
        if is_staged(name, root) and not overwrite:
            raise ValueError(f"dataset {name!r} is already staged in {d}; pass overwrite=True "
                             f"(CLI: --overwrite) to replace it")
        t0 = time.perf_counter()
        src, dst = read_edge_list(path, format, src_col, dst_col, header=header, sep=sep)
        if num_nodes is None and (format or _infer_format(Path(path))) == "npz":
            num_nodes = npz_num_nodes(path)  # trailing isolated nodes are nodes too
        if labels is None and not generate_labels:  # before any work is staged
            raise ValueError(f"{path}: no labels given. Pass a labels file (--labels), or ask "
                             "for generated labels (--generate-labels: classes made from the "
                             "graph, so accuracy only shows that training learns)")
        feat = read_features(features) if features is not None else None
        lab = read_labels(labels) if labels is not None else None
        sizes = {str(features): None if feat is None else feat.shape[0],
                 str(labels): None if lab is None else lab.shape[0]}
        given = {k: v for k, v in sizes.items() if v is not None}
        if len(set(given.values())) > 1:
            raise ValueError(f"row counts differ between features and labels: {given}")
        max_id = int(max(src.max(), dst.max())) if src.size else -1
        n = num_nodes if num_nodes is not None else next(iter(given.values()), max_id + 1)
        for file, rows in given.items():
            if rows != n:
                raise ValueError(f"{file}: has {rows} rows but the graph has {n} nodes")
        if max_id >= n:
            bad = Path(path)
            raise ValueError(f"{bad}: node id {max_id} is out of range: the features/labels "
                             f"(or num_nodes) give {n} nodes")
        masks = read_split(split, n) if split is not None else None
        log.info("read %s: %d nodes, %d edges (%.1f s)", path, n, src.shape[0],
                 time.perf_counter() - t0)
        return build_and_stage(src, dst, name=name, root=root, num_nodes=n, feat=feat,
                               labels=lab, masks=masks, source=f"import:{Path(path).name}",
                               seed=seed, split_fracs=split_fracs, make_symmetric=symmetric,
                               generate_labels=generate_labels,
                               extra={"files": {"edges": str(path), "features": _s(features),
                                                "labels": _s(labels), "split": _s(split)}})


def _s(p: Any) -> str | None:
    return None if p is None else str(p)


# ----------------------------------------------------------------------------- loaders

def _read_headerless_csv(path: Path, what: str, dtype: Any) -> np.ndarray:
    """A headerless numeric CSV (OGB raw/split files, gzipped or not) -> 2-D array."""
    import pandas as pd

    p = _need_file(path, what)
    try:
        df = pd.read_csv(p, header=None, dtype=dtype, engine="c")
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{p}: cannot parse {what} as numeric CSV: {exc}") from None
    return df.to_numpy()


def _ogb_split(d: Path, split_dir: str, num_nodes: int) -> tuple[np.ndarray, ...]:
    masks = []
    for part in ("train", "valid", "test"):
        p = d / "split" / split_dir / f"{part}.csv.gz"
        idx = _read_headerless_csv(p, f"{part} split", np.int64).ravel()
        masks.append(_to_mask(idx, num_nodes, str(p)))
    _check_disjoint(masks, d / "split" / split_dir)
    return tuple(masks)


def _stage_ogb(d: Path, t0: float, src, dst, feat, lab, lab_path: Path, split: str, source: str,
               name: str, root) -> Path:
    """The tail both OGB loaders share: labels to int, OGB's split, stage the graph."""
    n = feat.shape[0]
    labels = _labels_to_int(lab, lab_path)
    masks = _ogb_split(d, split, n)
    log.info("read %s: %d nodes, %d edges (%.1f s)", d, n, src.shape[0], time.perf_counter() - t0)
    return build_and_stage(src, dst, name=name, root=root, num_nodes=n,
                           feat=np.ascontiguousarray(feat, dtype=np.float32), labels=labels,
                           masks=masks, source=source, extra={"files": {"dir": str(d)}})


def load_ogbn_products(dir: str | os.PathLike, name: str = "ogbn-products",
                       root: str | os.PathLike = "data", overwrite: bool = False) -> Path:
    """ogbn-products from OGB's on-disk layout in `dir` (raw/edge.csv.gz, raw/node-feat.csv.gz,
    raw/node-label.csv.gz, split/sales_ranking/{train,valid,test}.csv.gz)."""
    d = Path(dir)
    with file_lock(dataset_dir(name, root) / ".lock"):
        if is_staged(name, root) and not overwrite:
            log.info("reusing staged %s", name)
            return dataset_dir(name, root)
        t0 = time.perf_counter()
        edges = _read_headerless_csv(d / "raw" / "edge.csv.gz", "edge list", np.int64)
        if edges.ndim != 2 or edges.shape[1] != 2:
            raise ValueError(f"{d / 'raw' / 'edge.csv.gz'}: expected 2 columns, got "
                             f"{edges.shape[1] if edges.ndim == 2 else edges.shape}")
        src = _as_ids(edges[:, 0], d / "raw" / "edge.csv.gz", "0")
        dst = _as_ids(edges[:, 1], d / "raw" / "edge.csv.gz", "1")
        feat = _read_headerless_csv(d / "raw" / "node-feat.csv.gz", "features", np.float32)
        n = feat.shape[0]
        lab_path = d / "raw" / "node-label.csv.gz"
        lab = _read_headerless_csv(lab_path, "labels", np.float64).ravel()
        if lab.shape[0] != n:
            raise ValueError(f"{lab_path}: has {lab.shape[0]} rows but node-feat has {n}")
        return _stage_ogb(d, t0, src, dst, feat, lab, lab_path, "sales_ranking", "ogbn-products",
                          name, root)


def load_ogbn_papers100m(dir: str | os.PathLike, name: str = "ogbn-papers100M",
                         root: str | os.PathLike = "data", overwrite: bool = False) -> Path:
    """ogbn-papers100M from OGB's layout (raw/data.npz with edge_index, node_feat, num_nodes
    (or num_nodes_list); raw/node-label.npz with node_label, NaN = unlabeled;
    split/time/{train,valid,test}.csv.gz). Needs ~100 GB of memory for the real thing."""
    d = Path(dir)
    with file_lock(dataset_dir(name, root) / ".lock"):
        if is_staged(name, root) and not overwrite:
            log.info("reusing staged %s", name)
            return dataset_dir(name, root)
        t0 = time.perf_counter()
        data_path = _need_file(d / "raw" / "data.npz", "graph data")
        with _open_npz(data_path, "graph data") as z:
            missing = [k for k in ("edge_index", "node_feat") if k not in z.files]
            if "num_nodes" not in z.files and "num_nodes_list" not in z.files:
                missing.append("num_nodes")
            if missing:
                raise ValueError(f"{data_path}: missing array(s) {missing} (found: {z.files})")
            ei = z["edge_index"]
            feat = z["node_feat"]
            n = int(np.asarray(z["num_nodes"] if "num_nodes" in z.files
                               else z["num_nodes_list"]).ravel()[0])
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise ValueError(f"{data_path}: edge_index must have shape (2, E), got {ei.shape}")
        if feat.shape[0] != n:
            raise ValueError(f"{data_path}: node_feat has {feat.shape[0]} rows but num_nodes "
                             f"is {n}")
        src = _as_ids(ei[0], data_path, "edge_index[0]")
        dst = _as_ids(ei[1], data_path, "edge_index[1]")
        del ei
        lab_path = _need_file(d / "raw" / "node-label.npz", "labels")
        with _open_npz(lab_path, "labels") as z:
            if "node_label" not in z.files:
                raise ValueError(f"{lab_path}: missing array 'node_label' (found: {z.files})")
            lab = np.asarray(z["node_label"], dtype=np.float64).ravel()
        if lab.shape[0] != n:
            raise ValueError(f"{lab_path}: has {lab.shape[0]} labels but num_nodes is {n}")
        return _stage_ogb(d, t0, src, dst, feat, lab, lab_path, "time", "ogbn-papers100M",
                          name, root)


def load_reddit(dir: str | os.PathLike, name: str = "reddit",
                root: str | os.PathLike = "data", overwrite: bool = False) -> Path:
    """Reddit from DGL's layout: reddit_data.npz (feature, label, node_types: 1 train, 2 val,
    3 test) and reddit_graph.npz (a scipy.sparse COO matrix saved by save_npz)."""
    import scipy.sparse as sp

    d = Path(dir)
    with file_lock(dataset_dir(name, root) / ".lock"):
        if is_staged(name, root) and not overwrite:
            log.info("reusing staged %s", name)
            return dataset_dir(name, root)
        t0 = time.perf_counter()
        data_path = _need_file(d / "reddit_data.npz", "reddit data")
        with _open_npz(data_path, "reddit data") as z:
            missing = [k for k in ("feature", "label", "node_types") if k not in z.files]
            if missing:
                raise ValueError(f"{data_path}: missing array(s) {missing} (found: {z.files})")
            feat, lab, types = z["feature"], z["label"], z["node_types"]
        n = feat.shape[0]
        for what, arr in (("label", lab), ("node_types", types)):
            if arr.shape[0] != n:
                raise ValueError(f"{data_path}: {what} has {arr.shape[0]} rows but feature "
                                 f"has {n}")
        graph_path = _need_file(d / "reddit_graph.npz", "reddit graph")
        try:
            coo = sp.load_npz(graph_path).tocoo()
        except (ValueError, OSError, KeyError) as exc:
            raise ValueError(f"{graph_path}: cannot read as a scipy sparse matrix: {exc}") from None
        if coo.shape != (n, n):
            raise ValueError(f"{graph_path}: adjacency is {coo.shape} but reddit_data has "
                             f"{n} nodes")
        masks = tuple(np.asarray(types == t) for t in (1, 2, 3))
        log.info("read %s: %d nodes, %d edges (%.1f s)", d, n, coo.nnz,
                 time.perf_counter() - t0)
        return build_and_stage(coo.row.astype(np.int64), coo.col.astype(np.int64), name=name,
                               root=root, num_nodes=n,
                               feat=np.ascontiguousarray(feat, dtype=np.float32),
                               labels=_labels_to_int(np.asarray(lab), data_path), masks=masks,
                               source="reddit", extra={"files": {"dir": str(d)}})


LOADERS: dict[str, Callable[..., Path]] = {
    "ogbn-products": load_ogbn_products,
    "ogbn-papers100M": load_ogbn_papers100m,
    "reddit": load_reddit,
}


def load_dataset(kind: str, dir: str | os.PathLike, name: str | None = None,
                 root: str | os.PathLike = "data", overwrite: bool = False) -> Path:
    """Stage a public dataset from its on-disk layout: kind is a key of LOADERS."""
    if kind not in LOADERS:
        raise ValueError(f"unknown dataset loader {kind!r}; valid: {sorted(LOADERS)}")
    if not Path(dir).is_dir():
        raise FileNotFoundError(f"{kind}: dataset folder not found: {dir}")
    return LOADERS[kind](dir, name=name or kind, root=root, overwrite=overwrite)
