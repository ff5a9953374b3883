"""Feature pulls: sent now, received later (train.pulls_in_flight).

`feat[ids]` on a DistTensor (DGL's fast pull) sends one request per remote machine and returns
once every response is in: with one pull at a time the link idles while the loader plans and
assembles. DGLPulls sends a pull (DGL's own PullRequest, one per remote machine that owns some of
the ids) and receives it later, so the next minibatch's pull can be on the wire while this one
is assembled. Responses are matched to their pull by message sequence number, so they may come
in any order; those of a later pull are kept until it is received.

DGL 2.1 has one receive queue per process, so while a pull is in flight every DGL RPC of this
process must go through the same DGLPulls (any other receive would take a pending pull's
response): sampling runs in sampler processes (train.samplers >= 1), and the check's pull is a
`pull` here (DGL's fast pull once every response on the way is in). A response of any other RPC
is an error naming that, never a wrong row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rudder.prefetch import jit
from rudder.prefetch.buffer import copy_rows


class DirectPulls:
    """One pull at a time: the DistTensor's own pull, when the rows are asked for."""

    most_in_flight = 1

    def send(self, feat, ids: torch.Tensor):
        return feat, ids

    def receive(self, sent) -> torch.Tensor:
        feat, ids = sent
        return feat[ids]

    def pull(self, feat, ids: torch.Tensor) -> torch.Tensor:
        return self.receive(self.send(feat, ids))


@dataclass
class _Sent:
    name: str
    n: int
    row_shape: tuple
    dtype: torch.dtype  # of the stored rows
    view: torch.dtype | None  # the dtype they are seen as (FeatureBits), or None
    local_pos: torch.Tensor  # output rows served from this machine's shared memory
    local_offsets: torch.Tensor  # their offsets in the local partition
    remote: dict  # msg_seq -> output rows its response fills


class DGLPulls:
    """Pulls through DGL's RPC, several in flight (see the module docstring)."""

    def __init__(self, timeout_s: float = 0.0):
        from dgl.distributed import rpc
        from dgl.distributed.kvstore import (KVSTORE_PULL, PullRequest, PullResponse, default_pull_handler,
                                             get_kvstore)

        self._rpc, self._request, self._response = rpc, PullRequest, PullResponse
        self._default = default_pull_handler
        self._service = KVSTORE_PULL
        self.kv = get_kvstore()
        self.timeout_ms = int(timeout_s * 1000)  # 0: wait as long as it takes (DGL's default)
        self.arrived: dict[int, torch.Tensor] = {}  # msg_seq -> rows, of pulls not yet received
        self.waiting: set[int] = set()  # msg_seq of requests sent whose response has not arrived
        self.in_flight = self.most_in_flight = 0  # pulls sent and not yet received (and the most)
        jit.warm()  # the row copy's kernel loaded now, not in the first minibatch

    def send(self, feat, ids: torch.Tensor) -> _Sent:
        stored = getattr(feat, "stored", feat)  # FeatureBits: pull the stored bits, view them after
        view = feat.dtype if stored is not feat else None
        name = stored.kvstore_key
        policy = self.kv._part_policy[name]
        owner = policy.to_partid(ids)
        me = self.kv._machine_id
        local_pos = torch.nonzero(owner == me).flatten()
        requests, positions = [], []
        for m in torch.unique(owner).tolist():
            if m != me:
                pos = torch.nonzero(owner == m).flatten()
                requests.append((m, self._request(name, ids[pos])))
                positions.append(pos)
        seqs = self._rpc.send_requests_to_machine(requests) if requests else {}
        self.waiting.update(seqs)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return _Sent(name, int(ids.numel()), tuple(stored.shape[1:]), stored.dtype, view, local_pos,
                     policy.to_local(ids[local_pos]), {seq: positions[i] for seq, i in seqs.items()})

    def receive(self, sent: _Sent) -> torch.Tensor:
        """The rows of `sent`, in its ids' order; waits for its responses, keeping others'."""
        while any(seq not in self.arrived for seq in sent.remote):
            self._receive_one()
        out = torch.empty((sent.n, *sent.row_shape), dtype=sent.dtype)
        if sent.local_pos.numel():  # from the shared memory: what DGL's default handler reads
            handler = self.kv._pull_handlers[sent.name]
            if handler is not self._default or not copy_rows(
                    out, sent.local_pos, self.kv._data_store[sent.name], sent.local_offsets):
                out[sent.local_pos] = handler(self.kv._data_store, sent.name, sent.local_offsets)
        for seq, pos in sent.remote.items():
            rows = self.arrived.pop(seq)
            if not copy_rows(out, pos, rows):
                out[pos] = rows
        self.in_flight -= 1
        return out if sent.view is None else out.view(sent.view)

    def pull(self, feat, ids: torch.Tensor) -> torch.Tensor:
        """`feat[ids]` now, by DGL's own fast pull (the check's: a path independent of this
        class): first every response on the way is taken in and kept, so none is left in the
        receive queue for the fast pull to take."""
        while self.waiting:
            self._receive_one()
        return feat[ids]

    def _receive_one(self) -> None:
        rpc = self._rpc
        msg = rpc.recv_rpc_message(self.timeout_ms)
        if msg is None:
            raise TimeoutError(f"no pull response within {self.timeout_ms / 1000:g} s "
                               f"({self.in_flight} pulls in flight)")
        if msg.service_id != self._service:
            raise RuntimeError(f"a response of DGL service {msg.service_id} arrived while feature "
                               "pulls were in flight: some RPC of this process bypassed DGLPulls")
        if msg.client_id != rpc.get_rank():
            raise RuntimeError(f"a pull response for client {msg.client_id} reached client {rpc.get_rank()}")
        self.waiting.discard(msg.msg_seq)
        self.arrived[msg.msg_seq] = rpc.deserialize_from_payload(self._response, msg.data, msg.tensors).data_tensor
