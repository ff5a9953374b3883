"""The pure-torch GraphSAGE (rudder.model) against DGL's SAGEConv on the CPU: the same output and
gradients from the same weights, the same initialisation from the same seed, and the same
accuracy when trained on the same minibatches. CUDA cases run where a GPU is present."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rudder  # noqa: F401  (sets DGLBACKEND)
from rudder.model import SAGE, Block, SAGEConv, as_blocks, mean_aggregate

dgl = pytest.importorskip("dgl")
from dgl.nn import SAGEConv as DGLSAGEConv  # noqa: E402
from rudder.model_dgl import DGLSAGE  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="no CUDA device"))]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """As a trainer (RUDDER_THREADS=1); OpenMP threads spinning on a busy host cost 10x here."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def graph():
    from rudder.data.synthetic import generate

    return generate("synth-tiny")


def sample(g, seeds, fanouts=(4, 6), seed=0):
    dgl.seed(seed)
    torch.manual_seed(seed)
    return dgl.dataloading.NeighborSampler(list(fanouts)).sample_blocks(g, seeds)


def test_block_structure_matches_the_dgl_block(graph):
    _, _, blocks = sample(graph, torch.arange(64))
    for b in blocks:
        src, dst = b.edges()
        for tb in (Block.from_dgl(b), Block.from_edges(src, dst, b.num_src_nodes(), b.num_dst_nodes())):
            assert (tb.num_src, tb.num_dst) == (b.num_src_nodes(), b.num_dst_nodes())
            # the same edge set, grouped both ways
            ins = sorted(zip(torch.repeat_interleave(torch.arange(tb.num_dst), tb.in_ptr.diff()).tolist(),
                             tb.in_src.tolist()))
            outs = sorted(zip(tb.out_dst.tolist(),
                              torch.repeat_interleave(torch.arange(tb.num_src), tb.out_ptr.diff()).tolist()))
            assert ins == outs == sorted(zip(dst.tolist(), src.tolist()))
            assert torch.equal(tb.deg.flatten(), b.in_degrees().clamp(min=1).float())


@pytest.mark.parametrize("in_feats,out_feats", [(16, 8), (8, 16), (8, 8)])  # both lin_before_mp sides
def test_conv_matches_dgl_output_and_gradients(graph, in_feats, out_feats):
    _, _, blocks = sample(graph, torch.arange(100))
    b = blocks[0]
    ref = DGLSAGEConv(in_feats, out_feats, "mean").double()
    mine = SAGEConv(in_feats, out_feats).double()
    mine.load_state_dict(ref.state_dict())  # same names: weights copy across
    x = torch.randn(b.num_src_nodes(), in_feats, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y = ref(b, x1), mine(Block.from_dgl(b), x2)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(y)
    (y_ref * w).sum().backward()
    (y * w).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-10, atol=1e-12)
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), mine.named_parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_aggregation_gradient_and_isolated_dst_nodes():
    # dst 2 has no in-edges (mean of nothing: zeros, as DGL); src 4 has no out-edges (zero grad)
    b = Block.from_edges(torch.tensor([0, 3, 1, 3, 0]), torch.tensor([0, 0, 1, 1, 3]), num_src=5, num_dst=4)
    h = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    out = mean_aggregate(b, h)
    torch.testing.assert_close(out[0], (h[0] + h[3]) / 2)
    torch.testing.assert_close(out[2], torch.zeros(3, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda t: mean_aggregate(b, t), (h,))
    empty = Block.from_edges(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), 3, 2)
    assert torch.equal(mean_aggregate(empty, torch.ones(3, 2)), torch.zeros(2, 2))


def test_same_seed_same_weights_as_dgl():
    torch.manual_seed(3)
    ref = DGLSAGE(32, 16, 8, 2)
    torch.manual_seed(3)
    mine = SAGE(32, 16, 8, 2)
    ref_sd, sd = ref.state_dict(), mine.state_dict()
    assert list(ref_sd) == list(sd)
    assert all(torch.equal(ref_sd[k], sd[k]) for k in sd)


@pytest.mark.parametrize("device", DEVICES)
def test_model_on_device_matches_dgl_on_cpu(graph, device):
    _, _, blocks = sample(graph, torch.arange(200), fanouts=(5, 10))
    torch.manual_seed(0)
    ref = DGLSAGE(16, 32, 4, 2).eval()
    mine = SAGE(16, 32, 4, 2).eval().to(device)
    mine.load_state_dict(ref.state_dict())
    x = graph.ndata["feat"][blocks[0].srcdata[dgl.NID]]
    y_ref = ref(blocks, x)
    y = mine(as_blocks(blocks, device), x.to(device))  # Blocks on the device
    assert y.device.type == device
    torch.testing.assert_close(y.cpu(), y_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mine(blocks, x.to(device)).cpu(), y_ref, rtol=1e-4, atol=1e-5)  # DGL blocks too


def minibatches(g, epochs):
    """Sampled once and given to both models (DGL's sampling is not reproducible by seed)."""
    train_ids = torch.nonzero(g.ndata["train_mask"]).flatten()
    out = []
    for epoch in range(epochs):
        order = train_ids[torch.randperm(train_ids.numel(), generator=torch.Generator().manual_seed(epoch))]
        out += [sample(g, order[i:i + 100], (5, 10)) for i in range(0, order.numel(), 100)]
    return out, sample(g, torch.nonzero(g.ndata["val_mask"]).flatten(), (5, 10))


def train(model, g, mbs, val):
    """Minibatch training as rudder.train does it (Adam, cross-entropy, dropout), one process."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for i, (input_nodes, seeds, blocks) in enumerate(mbs):
        torch.manual_seed(i)  # the same dropout masks for both models
        loss = F.cross_entropy(model(blocks, g.ndata["feat"][input_nodes]), g.ndata["label"][seeds].long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    input_nodes, seeds, blocks = val
    with torch.no_grad():
        pred = model(blocks, g.ndata["feat"][input_nodes]).argmax(1)
    return float((pred == g.ndata["label"][seeds]).float().mean()), losses


def test_training_reaches_the_same_accuracy_as_dgl(graph):
    classes = int(graph.ndata["label"].max()) + 1
    torch.manual_seed(0)
    ref = DGLSAGE(graph.ndata["feat"].shape[1], 16, classes, 2)
    mine = SAGE(graph.ndata["feat"].shape[1], 16, classes, 2)
    mine.load_state_dict(ref.state_dict())
    mbs, val = minibatches(graph, epochs=4)
    acc_ref, loss_ref = train(ref, graph, mbs, val)
    acc, loss = train(mine, graph, mbs, val)
    assert acc_ref > 2.0 / classes  # it learned (chance is 1/classes)
    assert abs(acc - acc_ref) <= 0.01, (acc, acc_ref)
    # the same minibatches, masks and weights: the trajectories agree up to float rounding
    torch.testing.assert_close(torch.tensor(loss), torch.tensor(loss_ref), rtol=1e-3, atol=1e-3)
