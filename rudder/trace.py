"""Remote-access traces: what one trainer asked of other partitions, minibatch by minibatch.

Written by training runs (`runs/<id>/trace-r<R>.npz`, through `TraceWriter`) and by
`rudder.sim.tracegen` (no training); read by `rudder oracle` and `rudder sim` (rudder.sim).
It sits beside rudder.records, not in the simulator, so the trainer writes it without importing
the simulator package.

Arrays in the .npz (all the simulator needs; no feature rows):
  halo        int64 [H]    sorted unique halo node ids of the trainer's partition (cacheable)
  offsets     int64 [S+1]  minibatch i's accesses are ids[offsets[i]:offsets[i+1]]
  ids         int64 [N]    each minibatch's remote input node ids, concatenated; unique within a
                           minibatch. Remote ids that are not halo nodes (2+ hops away) appear
                           too: they count as remote accesses but can never be buffered
                           by the halo buffer (the oracle's "all remote nodes" universe keeps them).
  epoch       int32 [S]    epoch of each minibatch
  init        int64 [K]    ids of the buffer's initial fill (K <= capacity)
  input_rows  int64 [S]    all input rows of each minibatch (local + remote); -1 = not recorded
scalars: capacity, feat_bytes (bytes per feature row), part_id, num_parts.
"""
from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_SCALARS = ("capacity", "feat_bytes", "part_id", "num_parts")


def _as_np(x, dtype) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


@dataclass
class Trace:
    halo: np.ndarray
    offsets: np.ndarray
    ids: np.ndarray
    epoch: np.ndarray
    init: np.ndarray
    capacity: int
    feat_bytes: int = 0
    part_id: int = 0
    num_parts: int = 1
    input_rows: np.ndarray | None = None
    meta: dict = field(default_factory=dict)  # not saved; e.g. where it was loaded from

    def __post_init__(self):
        self.halo = _as_np(self.halo, np.int64)
        self.offsets = _as_np(self.offsets, np.int64)
        self.ids = _as_np(self.ids, np.int64)
        self.epoch = _as_np(self.epoch, np.int32)
        self.init = _as_np(self.init, np.int64)
        S = self.num_minibatches
        if self.input_rows is None:
            self.input_rows = np.full(S, -1, dtype=np.int64)
        self.input_rows = _as_np(self.input_rows, np.int64)
        self.capacity, self.feat_bytes = int(self.capacity), int(self.feat_bytes)
        self.part_id, self.num_parts = int(self.part_id), int(self.num_parts)
        self._hpos: tuple[np.ndarray, np.ndarray] | None = None
        self._remote: np.ndarray | None = None

    # ---- shape ----------------------------------------------------------------------------
    @property
    def num_minibatches(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def num_accesses(self) -> int:
        """All remote accesses (halo or not): the denominator of every hit rate."""
        return int(self.ids.size)

    @property
    def num_halo(self) -> int:
        return int(self.halo.size)

    def minibatch(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def head(self, n: int) -> "Trace":
        """The first n minibatches (e.g. to match a run that stopped early)."""
        n = max(0, min(int(n), self.num_minibatches))
        return Trace(
            halo=self.halo, offsets=self.offsets[: n + 1], ids=self.ids[: self.offsets[n]],
            epoch=self.epoch[:n], init=self.init, capacity=self.capacity, feat_bytes=self.feat_bytes,
            part_id=self.part_id, num_parts=self.num_parts, input_rows=self.input_rows[:n],
            meta=dict(self.meta),
        )

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def steps(self) -> np.ndarray:
        """Step within its epoch of every minibatch (epochs are contiguous runs)."""
        S = self.num_minibatches
        if S == 0:
            return np.zeros(0, dtype=np.int64)
        new = np.ones(S, dtype=bool)
        new[1:] = self.epoch[1:] != self.epoch[:-1]
        starts = np.flatnonzero(new)
        first = starts[np.cumsum(new) - 1]
        return np.arange(S) - first

    def digest(self) -> str:
        """A short content hash (halo, accesses, epochs, initial fill, capacity): replays are
        comparable only on the same digest. tracegen gives one trace per spec and seed (METIS and
        the sampler seeded, since 2026-12-06; traces made before differ from checkout to
        checkout); a live run's trace is what its trainers sampled."""
        h = hashlib.sha256()
        for a in (self.halo, self.offsets, self.ids, self.epoch, self.init):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(str(self.capacity).encode())
        return h.hexdigest()[:12]

    # ---- halo positions -------------------------------------------------------------------
    def halo_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """(is_halo [N] bool, halo position [N] int64, -1 where not halo) of every access;
        computed once (one binary search over all accesses) and cached."""
        if self._hpos is None:
            self._hpos = halo_index(self.halo, self.ids)
        return self._hpos

    def remote_nodes(self) -> np.ndarray:
        """Every remote node the trace records (halo ∪ accessed ids, sorted): the universe of a
        buffer not restricted to the 1-hop halo. Computed once (a sort of all accesses), cached."""
        if self._remote is None:
            self._remote = np.union1d(self.halo, self.ids)
        return self._remote

    def init_positions(self) -> np.ndarray:
        """Halo positions of the initial fill, in fill order (non-halo ids dropped)."""
        ok, pos = halo_index(self.halo, self.init)
        return pos[ok]

    # ---- checks and I/O -------------------------------------------------------------------
    def validate(self) -> None:
        S = self.num_minibatches
        if S < 0 or self.offsets[0] != 0 or self.offsets[-1] != self.ids.size:
            raise ValueError("trace offsets must start at 0 and end at len(ids)")
        if np.any(np.diff(self.offsets) < 0):
            raise ValueError("trace offsets must be non-decreasing")
        if self.epoch.size != S or self.input_rows.size != S:
            raise ValueError("trace epoch/input_rows must have one entry per minibatch")
        if self.halo.size and np.any(np.diff(self.halo) <= 0):
            raise ValueError("trace halo ids must be sorted and unique")
        if np.unique(self.init).size != self.init.size:
            raise ValueError("trace init ids must be unique")
        if self.capacity < 0:
            raise ValueError("trace capacity must be >= 0")

    def save(self, path: str | Path) -> Path:
        """Atomic: a crash mid-write never leaves a torn trace behind."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            halo=self.halo, offsets=self.offsets, ids=self.ids, epoch=self.epoch, init=self.init,
            input_rows=self.input_rows,
            **{k: np.int64(getattr(self, k)) for k in _SCALARS},
        )
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"trace not found: {path}")
        try:
            z = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile):  # truncated, or another kind
            raise ValueError(f"{path}: not a trace (not a readable .npz file)") from None
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError(f"{path}: not a trace (an .npy array, not an .npz file)")
        with z:
            missing = {"halo", "offsets", "ids", "epoch", "init", *_SCALARS} - set(z.files)
            if missing:
                raise ValueError(f"{path}: not a trace, missing {sorted(missing)}")
            t = cls(
                halo=z["halo"], offsets=z["offsets"], ids=z["ids"], epoch=z["epoch"],
                init=z["init"], input_rows=z["input_rows"] if "input_rows" in z.files else None,
                **{k: int(z[k]) for k in _SCALARS},
            )
        t.meta["path"] = str(path)
        t.validate()
        return t

    @classmethod
    def from_minibatches(
        cls, halo, minibatches: list, init=(), capacity: int | None = None, epochs=None, **scalars
    ) -> "Trace":
        """Convenience for tests and generators: a list of per-minibatch id lists."""
        mbs = [_as_np(m, np.int64) for m in minibatches]
        offsets = np.zeros(len(mbs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([m.size for m in mbs])
        ids = np.concatenate(mbs) if mbs else np.zeros(0, dtype=np.int64)
        halo = np.unique(_as_np(halo, np.int64))
        init = _as_np(init, np.int64)
        epochs = np.zeros(len(mbs), dtype=np.int32) if epochs is None else epochs
        cap = int(init.size if capacity is None else capacity)
        t = cls(halo=halo, offsets=offsets, ids=ids, epoch=epochs, init=init, capacity=cap, **scalars)
        t.validate()
        return t


def halo_index(halo: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(is_halo, position in the sorted `halo`, -1 where not halo) for each id."""
    if halo.size == 0:
        return np.zeros(ids.size, dtype=bool), np.full(ids.size, -1, dtype=np.int64)
    pos = np.searchsorted(halo, ids)
    np.minimum(pos, halo.size - 1, out=pos)
    ok = halo[pos] == ids
    pos = np.where(ok, pos, -1)
    return ok, pos


class TraceWriter:
    """Appends minibatches during training; writes the .npz on close (and on `flush`).

        writer = TraceWriter(run_dir / f"trace-r{rank}.npz", halo, init, capacity, ...)
        writer.add(epoch, remote_ids)   # once per minibatch, remote input ids (tensor or array)
        writer.close()

    Ids are kept as int64 chunks in memory (8 bytes per remote access). The whole trace is
    rewritten atomically after `flush_from` minibatches and again each time their number
    doubles, so a killed run keeps a usable prefix of at least half its minibatches (0 = only on
    close), and the rewrites add up to at most twice the trace: a fixed period rewrote it all
    every period, on the loader thread, work that grew with the square of the run's length."""

    def __init__(
        self,
        path: str | Path,
        halo,
        init,
        capacity: int,
        feat_bytes: int = 0,
        part_id: int = 0,
        num_parts: int = 1,
        flush_from: int = 0,
    ):
        self.path = Path(path)
        self.halo = np.unique(_as_np(halo, np.int64))
        self.init = _as_np(init, np.int64)
        self.scalars = dict(capacity=int(capacity), feat_bytes=int(feat_bytes), part_id=int(part_id),
                            num_parts=int(num_parts))
        self._next_flush = int(flush_from)
        self._chunks: list[np.ndarray] = []
        self._epochs: list[int] = []
        self._input_rows: list[int] = []
        self._closed = False

    def add(self, epoch: int, remote_ids, input_rows: int | None = None) -> None:
        if self._closed:
            raise RuntimeError("TraceWriter is closed")
        self._chunks.append(_as_np(remote_ids, np.int64).ravel().copy())
        self._epochs.append(int(epoch))
        self._input_rows.append(-1 if input_rows is None else int(input_rows))
        if self._next_flush and len(self._chunks) >= self._next_flush:
            self._next_flush *= 2
            self.flush()

    def __len__(self) -> int:
        return len(self._chunks)

    def trace(self) -> Trace:
        return Trace.from_minibatches(
            self.halo, self._chunks, init=self.init, epochs=np.asarray(self._epochs, dtype=np.int32),
            input_rows=np.asarray(self._input_rows, dtype=np.int64), **self.scalars,
        )

    def flush(self) -> Path:
        return self.trace().save(self.path)

    def close(self) -> Path | None:
        if self._closed:
            return None
        self._closed = True
        return self.flush()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def find_traces(run_dir: str | Path) -> dict[int, Path]:
    """rank -> trace path for every trace-r<R>.npz in a run directory."""
    out = {}
    for p in sorted(Path(run_dir).glob("trace-r*.npz")):
        stem = p.name[len("trace-r") : -len(".npz")]
        if stem.isdigit():
            out[int(stem)] = p
    return out
