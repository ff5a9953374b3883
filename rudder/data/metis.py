"""A reproducible METIS assignment for `dgl.distributed.partition_graph`.

DGL 2.1's own METIS call takes no seed and its cuts differ from one call to the next on the same
graph (synth-small's 2-way cut: 15,239 or 15,435 edges, even twice in one process), so two
checkouts partitioned the same graph differently and every trace, suite fold and figure made
from a METIS partitioning differed with them. Here METIS (the library pymetis ships) runs with a
fixed seed on the graph DGL would give it (simple, symmetric, no self-loops) and DGL's vertex
weights (one column per value of `balance_ntypes`, then in-degrees per value when
`balance_edges`), so the same graph, parts and seed give the same assignment anywhere.

METIS_PartGraphKway / Recursive are called through ctypes: pymetis's `part_graph` hands METIS one
balance constraint whatever the weights (measured: with DGL's four columns the train nodes of a
2-way cut came out 507 / 693; called directly with ncon = 4, 611 / 589, METIS's 3%). METIS draws
from the C library's rand(), so seeds 0 and 1 give one cut, and any other thread of the process
that calls rand() during the cut changes it (measured: 9-12k of synth-small's 20k nodes moved
with one such thread; a full pytest run hit it). So the call runs in a child process of its own
(`_in_child`: about 0.5 s more per cut, BENCHMARKS §14), where nothing else draws.

`seeded_metis(seed)` is a context in which partition_graph uses this assignment; the rest of
partition_graph (halo construction, id reshuffle, files) is DGL's own.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

METIS_OK = 1


def _library():
    try:  # its METIS: 64-bit idx_t, the METIS_* symbols exported
        import pymetis._internal as metis_lib
    except ImportError as e:
        raise ImportError("METIS partitioning needs pymetis (requirements.txt: pymetis==2025.2.2; "
                          "`make setup` installs it); --method random does without") from e

    if metis_lib._idx_type_width() != 64:
        raise RuntimeError("pymetis's METIS is not built with 64-bit indices")
    return ctypes.CDLL(metis_lib.__file__), metis_lib.options_indices


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def assignment(g, k: int, balance_ntypes=None, balance_edges: bool = False,
               mode: str = "k-way", objtype: str = "cut", seed: int = 0):
    """Partition id (int64 tensor, one per node of `g`) of a k-way METIS cut of `g`'s symmetric
    simple graph; the arguments are `dgl.partition.metis_partition_assignment`'s."""
    import dgl
    import torch

    if mode not in ("k-way", "recursive"):
        raise ValueError(f"METIS mode must be 'k-way' or 'recursive', got {mode!r}")
    if objtype not in ("cut", "vol"):
        raise ValueError(f"METIS objtype must be 'cut' or 'vol', got {objtype!r}")
    n = g.num_nodes()
    if k == 1:
        return torch.zeros(n, dtype=torch.int64)
    src, dst = g.edges()
    keep = src != dst
    sym = dgl.to_bidirected(dgl.graph((src[keep], dst[keep]), num_nodes=n))
    indptr, indices, _ = sym.adj_tensors("csr")
    columns = []
    if balance_ntypes is not None:
        ntypes = torch.as_tensor(balance_ntypes)
        if ntypes.shape[0] != n:
            raise ValueError(f"balance_ntypes has {ntypes.shape[0]} entries for {n} nodes")
        values = torch.unique(ntypes)
        columns = [(ntypes == v).long() for v in values]
        if balance_edges:
            deg = g.in_degrees().long()
            columns += [deg * (ntypes == v).long() for v in values]
    elif balance_edges:
        columns = [g.in_degrees().long()]
    # METIS reads the weights node-major: node i's ncon weights side by side
    vwgt = torch.stack(columns, 1).reshape(-1).numpy().astype(np.int64) if columns else None

    _library()  # pymetis missing or unfit: its error here, before a child starts
    xadj = np.ascontiguousarray(indptr.numpy(), dtype=np.int64)
    adjncy = np.ascontiguousarray(indices.numpy(), dtype=np.int64)
    status, part = _in_child(xadj=xadj, adjncy=adjncy, vwgt=vwgt, k=k, seed=int(seed),
                             recursive=mode == "recursive", vol=objtype == "vol",
                             ncon=max(1, len(columns)))
    if status != METIS_OK:
        raise RuntimeError(f"METIS into {k} parts failed (status {status}) on {n} nodes")
    return torch.from_numpy(part)


@contextlib.contextmanager
def seeded_metis(seed: int) -> Iterator[None]:
    """Within: `dgl.distributed.partition_graph(part_method="metis")` assigns nodes with
    `assignment(..., seed=seed)` instead of DGL's unseeded METIS call (the one name
    partition_graph looks up; DGL is pinned at 2.1.0)."""
    from dgl.distributed import partition as dgl_partition

    original = dgl_partition.metis_partition_assignment

    def seeded(g, k, balance_ntypes=None, balance_edges=False, mode="k-way", objtype="cut"):
        return assignment(g, k, balance_ntypes, balance_edges, mode, objtype, seed)

    dgl_partition.metis_partition_assignment = seeded
    try:
        yield
    finally:
        dgl_partition.metis_partition_assignment = original


def _in_child(**call) -> tuple[int, np.ndarray]:
    """_call(**call) in a fresh interpreter: its rand() is METIS's alone (see the module's doc).
    The arrays go through .npy files in a temporary folder ($TMPDIR) that the child maps (copy
    on write: METIS only reads them) rather than reads into memory of its own."""
    with tempfile.TemporaryDirectory(prefix="rudder-metis-") as tmp:
        arrays = {k: v for k, v in call.items() if isinstance(v, np.ndarray)}
        for name, a in arrays.items():
            np.save(Path(tmp) / f"{name}.npy", a)
        scalars = {k: int(v) for k, v in call.items() if k not in arrays and v is not None}
        # this file as a script (it imports nothing of rudder's; -P: its folder not on sys.path),
        # so the child needs no PYTHONPATH for the package and starts without importing it
        r = subprocess.run([sys.executable, "-P", __file__, tmp, json.dumps(scalars)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"the METIS child process failed (exit {r.returncode}): "
                               f"{r.stderr.strip()[-2000:]}")
        return int(r.stdout.strip().splitlines()[-1]), np.load(Path(tmp) / "part.npy")


def _call(xadj: np.ndarray, adjncy: np.ndarray, vwgt: np.ndarray | None, k: int, seed: int,
          recursive: bool, vol: bool, ncon: int) -> tuple[int, np.ndarray]:
    """METIS_PartGraphKway (or Recursive) on a CSR graph with `ncon` weights per node: (status,
    part). Call it only where no other thread draws from rand(): `_in_child` does."""
    lib, index = _library()
    options = np.zeros(64, dtype=np.int64)  # >= METIS_NOPTIONS (40)
    lib.METIS_SetDefaultOptions(_ptr(options))
    options[index.SEED] = seed
    options[index.OBJTYPE] = 1 if vol else 0  # METIS_OBJTYPE_VOL / _CUT
    n = xadj.size - 1
    nvtxs, ncon_, nparts, cut = (ctypes.c_int64(x) for x in (n, ncon, k, 0))
    part = np.zeros(n, dtype=np.int64)
    call = lib.METIS_PartGraphRecursive if recursive else lib.METIS_PartGraphKway
    status = call(ctypes.byref(nvtxs), ctypes.byref(ncon_), _ptr(xadj), _ptr(adjncy), _ptr(vwgt),
                  None, None, ctypes.byref(nparts), None, None, _ptr(options),
                  ctypes.byref(cut), _ptr(part))
    return int(status), part


def _child() -> None:
    """The child process of _in_child (this file run as a script): argv the folder of its .npy
    files and its scalars (JSON); writes part.npy there and prints METIS's status."""
    folder, scalars = Path(sys.argv[1]), json.loads(sys.argv[2])
    arrays = {p.stem: np.load(p, mmap_mode="c") for p in folder.glob("*.npy")}
    status, part = _call(arrays["xadj"], arrays["adjncy"], arrays.get("vwgt"), **scalars)
    np.save(folder / "part.npy", part)
    print(status)


if __name__ == "__main__":
    _child()
