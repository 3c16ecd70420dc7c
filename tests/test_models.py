"""The models' layers compute the textbook formulas (dense matrices on a small graph), on whole
graphs and on sampled blocks, and train through blocks; both backends (dgl.nn and the plain-torch
layers) compute the same outputs, gradients and optimiser steps on the same parameters."""
import dgl
import pytest
import torch
import torch.nn.functional as F

from degnn.models import GNN, build_model


@pytest.fixture
def graph():
    torch.manual_seed(0)
    dgl.seed(0)
    g = dgl.remove_self_loop(dgl.to_bidirected(dgl.rand_graph(60, 300)))
    return g, torch.randn(60, 8)


def dense_adj(g) -> torch.Tensor:
    """A[dst, src] = 1 for every edge src -> dst."""
    src, dst = g.edges()
    a = torch.zeros(g.num_nodes(), g.num_nodes())
    a[dst, src] = 1.0
    return a


BACKENDS = ["dgl", "torch"]


def one_layer(kind, heads=2, backend="dgl"):
    torch.manual_seed(1)
    return GNN(kind, 8, 6, 6, layers=1, dropout=0.0, heads=heads, backend=backend).eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sage_is_self_plus_neighbour_mean(graph, backend):
    g, x = graph
    model = one_layer("sage", backend=backend)
    conv = model.layers[0]
    a = dense_adj(g)
    mean = (a @ x) / a.sum(1, keepdim=True).clamp(min=1)
    expected = x @ conv.fc_self.weight.T + conv.fc_self.bias + mean @ conv.fc_neigh.weight.T
    torch.testing.assert_close(model([g], x), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gcn_is_mean_over_self_and_neighbours(graph, backend):
    g, x = graph
    model = one_layer("gcn", backend=backend)
    conv = model.layers[0]
    a = dense_adj(g) + torch.eye(g.num_nodes())
    expected = (a / a.sum(1, keepdim=True)) @ x @ conv.weight + conv.bias
    torch.testing.assert_close(model([g], x), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gat_is_softmax_attention_over_neighbours_and_self(graph, backend):
    g, x = graph
    heads = 2
    model = one_layer("gat", heads, backend)
    conv = model.layers[0]
    n = g.num_nodes()
    a = dense_adj(g) + torch.eye(n)
    h = (x @ conv.fc.weight.T).view(n, heads, -1)  # [N, heads, D]
    el = (h * conv.attn_l).sum(-1)  # [N, heads], source term
    er = (h * conv.attn_r).sum(-1)  # destination term
    score = F.leaky_relu(er[:, None, :] + el[None, :, :], 0.2)  # [dst, src, heads]
    score = score.masked_fill(a[:, :, None] == 0, float("-inf"))
    alpha = torch.softmax(score, dim=1)
    out = torch.einsum("dsh,shk->dhk", alpha, h) + conv.bias.view(1, heads, -1)
    expected = out.mean(1)  # the last layer averages its heads
    torch.testing.assert_close(model([g], x), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_full_neighbour_block_equals_whole_graph(graph, kind, backend):
    """Layer-wise inference on a full-neighbour block gives the whole-graph result for its seeds."""
    g, x = graph
    model = one_layer(kind, backend=backend)
    seeds = torch.arange(0, 60, 3)
    block = dgl.to_block(dgl.in_subgraph(g, seeds), seeds)
    out = model.layer_forward(0, block, x[block.srcdata[dgl.NID]])
    torch.testing.assert_close(out, model([g], x)[seeds], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_sampled_blocks_forward_and_backward(graph, kind):
    g, x = graph
    model = GNN(kind, 8, 16, 4, layers=2, dropout=0.1)
    sampler = dgl.dataloading.NeighborSampler([3, 5])
    seeds = torch.arange(10)
    input_nodes, output_nodes, blocks = sampler.sample(g, seeds)
    out = model(blocks, x[input_nodes])
    assert out.shape == (10, 4)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_old_hand_written_checkpoint_is_refused_clearly():
    model = GNN("sage", 8, 16, 4, layers=2)
    old = {"layers.0.self_linear.weight": torch.zeros(16, 8)}
    with pytest.raises(ValueError, match="earlier hand-written layers"):
        model.load_state_dict(old)


def test_fanouts_must_match_layers():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"name": "sage", "layers": 3, "hidden": 8, "fanouts": [10, 25], "dropout": 0.0, "heads": 1})
    with pytest.raises(ValueError, match="one fan-out per layer"):
        build_model(cfg, 4, 2)


def test_sampling_bytes_from_one_ownership_lookup(graph):
    """Every block's seeds are a prefix of the batch's input nodes, so the remote flags of the
    input nodes give each hop's remote seeds; the count equals the per-hop computation."""
    from degnn.metrics import ID_BYTES, sampling_bytes

    g, _ = graph
    owner = torch.arange(g.num_nodes()) % 3  # three machines; we are machine 0
    input_nodes, _, blocks = dgl.dataloading.NeighborSampler([4, 3]).sample(g, torch.arange(0, 60, 6))
    expected = 0
    for block in blocks:
        remote_seed = owner[block.dstdata[dgl.NID]] != 0
        _, dst = block.edges()
        expected += ID_BYTES * int(remote_seed.sum()) + 3 * ID_BYTES * int(remote_seed[dst].sum())
    assert expected > 0
    assert sampling_bytes(owner[input_nodes] != 0, blocks) == expected


# --- the two backends ------------------------------------------------------------------------------
def _pair(kind, layers=3, dropout=0.5):
    """The same model (same initial parameters) with each backend."""
    torch.manual_seed(3)
    a = GNN(kind, 8, 12, 5, layers=layers, dropout=dropout, heads=3 if kind == "gat" else 4, backend="dgl")
    b = GNN(kind, 8, 12, 5, layers=layers, dropout=dropout, heads=3 if kind == "gat" else 4, backend="torch")
    b.load_state_dict(a.state_dict())
    return a, b


def _batch(graph, seeds=torch.arange(0, 60, 4)):
    g, x = graph
    dgl.seed(4)  # DGL's sampler draws from its own generator, not torch's
    input_nodes, _, blocks = dgl.dataloading.NeighborSampler([4, 3, 5]).sample(g, seeds)
    return blocks, x[input_nodes]


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_backends_same_outputs_gradients_and_step(graph, kind):
    """Same parameters, same sampled blocks, same dropout draws: the same outputs, gradients of
    every parameter and of the inputs, and the same parameters after one Adam step. The 12-wide
    hidden layers sit between an 8-wide input and a 5-wide output: the first layer aggregates
    before it projects and the last projects first (both orders of SAGE and GCN)."""
    blocks, x = _batch(graph)
    models = _pair(kind)
    outs, grads, after = [], [], []
    for model in models:
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        xi = x.clone().requires_grad_()
        torch.manual_seed(9)  # the same dropout masks
        out = model(blocks, xi)
        loss = F.cross_entropy(out, torch.arange(len(out)) % 5)
        loss.backward()
        outs.append(out.detach())
        grads.append({"x": xi.grad, **{k: p.grad.clone() for k, p in model.named_parameters()}})
        opt.step()
        after.append({k: v.clone() for k, v in model.state_dict().items()})
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-4)
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], atol=1e-5, rtol=1e-4, msg=lambda m: f"{k}: {m}")
    # Adam's first step is lr * g / (|g| + eps), about lr times the gradient's sign: where a gradient
    # is float noise (CI once met 5 of a GAT attention vector's 15 values so, with unseeded batches)
    # the backends' steps may differ; there the step is bounded, everywhere else it must agree.
    # A gradient that is exactly 0 in both (a unit ReLU or dropout silenced) gives both a step of 0.
    def is_decided(k, v):
        if k not in grads[0]:
            return torch.ones_like(v, dtype=torch.bool)
        return (grads[0][k].abs() > 1e-4) | ((grads[0][k] == 0) & (grads[1][k] == 0))
    decided = {k: is_decided(k, v) for k, v in after[0].items()}
    assert sum(int(d.sum()) for d in decided.values()) > 0.9 * sum(d.numel() for d in decided.values())
    for k in after[0]:
        decided_k = decided[k]
        torch.testing.assert_close(after[1][k][decided_k], after[0][k][decided_k], atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f"{k}: {m}")
        assert (after[1][k] - after[0][k]).abs().max() <= 2 * 0.05 + 1e-6, k


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_backends_agree_on_a_whole_graph_with_self_loops_and_lonely_nodes(kind):
    """A whole graph's own self loops are replaced by one loop a node (GCN, GAT), and a node
    without in-edges gets DGL's mean of nothing (SAGE: 0) in both backends; a block keeps its
    sampled edges and its destinations without in-edges too."""
    torch.manual_seed(0)
    g = dgl.graph((torch.tensor([0, 1, 1, 2, 3, 3]), torch.tensor([1, 0, 1, 2, 0, 2])), num_nodes=6)
    x = torch.randn(6, 8)
    a, b = _pair(kind, layers=1, dropout=0.0)
    torch.testing.assert_close(b([g], x), a([g], x), atol=1e-5, rtol=1e-4)
    block = dgl.create_block((torch.tensor([0, 2, 4, 1]), torch.tensor([0, 0, 1, 1])), num_src_nodes=5, num_dst_nodes=3)
    torch.testing.assert_close(b([block], x[:5]), a([block], x[:5]), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_a_checkpoint_of_one_backend_loads_in_the_other(graph, kind, tmp_path):
    """Trained a step with the torch backend, saved, loaded into a fresh dgl-backend model (and the
    torch layers' own modules have dgl.nn's keys and shapes): the same outputs."""
    from degnn.models import torch_layers

    blocks, x = _batch(graph)
    _, trained = _pair(kind)
    opt = torch.optim.SGD(trained.parameters(), lr=0.5)
    F.cross_entropy(trained(blocks, x), torch.zeros(len(blocks[-1].dstnodes()), dtype=torch.long)).backward()
    opt.step()
    torch.save(trained.state_dict(), tmp_path / "ckpt.pt")
    fresh = GNN(kind, 8, 12, 5, layers=3, dropout=0.5, heads=3 if kind == "gat" else 4, backend="dgl")
    fresh.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    trained.eval(), fresh.eval()
    torch.testing.assert_close(fresh(blocks, x), trained(blocks, x), atol=1e-5, rtol=1e-4)
    conv = trained.layers[0]
    plain = {"sage": lambda: torch_layers.SAGELayer(8, 12), "gcn": lambda: torch_layers.GCNLayer(8, 12),
             "gat": lambda: torch_layers.GATLayer(8, 4, 3)}[kind]()
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in conv.state_dict().items()}
    plain.load_state_dict(conv.state_dict())
    adj = torch_layers.Adjacency(*blocks[0].edges(), blocks[0].num_src_nodes(), blocks[0].num_dst_nodes())
    torch.testing.assert_close(plain(adj, x), torch_layers.LAYERS[kind](conv, adj, x))


def test_backend_choice_and_a_structure_left_on_another_device():
    """auto: dgl on the CPU, torch on a GPU this CPU-only DGL cannot use (where dgl is refused); a
    hop whose structure is not on the inputs' device is an error, not a silent copy."""
    from degnn.models import torch_layers
    from degnn.models.backend import choose_backend

    assert choose_backend("auto", "cpu") == "dgl" and choose_backend("torch", "cpu") == "torch"
    assert choose_backend("auto", "cuda") == "torch"
    with pytest.raises(ValueError, match="CPU build"):
        choose_backend("dgl", "cuda")
    with pytest.raises(ValueError, match="choose dgl"):
        GNN("sage", 8, 6, 6, layers=1, backend="cuda")
    adj = torch_layers.Adjacency(torch.tensor([0, 1]), torch.tensor([1, 0]), 2, 2).to("meta")
    with pytest.raises(RuntimeError, match="move the batch"):
        one_layer("sage", backend="torch").layer_forward(0, adj, torch.randn(2, 8))
