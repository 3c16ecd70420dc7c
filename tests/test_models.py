"""The models' layers compute the textbook formulas (dense matrices on a small graph), on whole
graphs and on sampled blocks, and train through blocks."""
import dgl
import pytest
import torch
import torch.nn.functional as F

from degnn.models import GNN, build_model


@pytest.fixture
def graph():
    torch.manual_seed(0)
    g = dgl.remove_self_loop(dgl.to_bidirected(dgl.rand_graph(60, 300)))
    return g, torch.randn(60, 8)


def dense_adj(g) -> torch.Tensor:
    """A[dst, src] = 1 for every edge src -> dst."""
    src, dst = g.edges()
    a = torch.zeros(g.num_nodes(), g.num_nodes())
    a[dst, src] = 1.0
    return a


def one_layer(kind, heads=2):
    torch.manual_seed(1)
    return GNN(kind, 8, 6, 6, layers=1, dropout=0.0, heads=heads).eval()


def test_sage_is_self_plus_neighbour_mean(graph):
    g, x = graph
    model = one_layer("sage")
    conv = model.layers[0]
    a = dense_adj(g)
    mean = (a @ x) / a.sum(1, keepdim=True).clamp(min=1)
    expected = x @ conv.fc_self.weight.T + conv.fc_self.bias + mean @ conv.fc_neigh.weight.T
    torch.testing.assert_close(model([g], x), expected, atol=1e-5, rtol=1e-4)


def test_gcn_is_mean_over_self_and_neighbours(graph):
    g, x = graph
    model = one_layer("gcn")
    conv = model.layers[0]
    a = dense_adj(g) + torch.eye(g.num_nodes())
    expected = (a / a.sum(1, keepdim=True)) @ x @ conv.weight + conv.bias
    torch.testing.assert_close(model([g], x), expected, atol=1e-5, rtol=1e-4)


def test_gat_is_softmax_attention_over_neighbours_and_self(graph):
    g, x = graph
    heads = 2
    model = one_layer("gat", heads)
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


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_full_neighbour_block_equals_whole_graph(graph, kind):
    """Layer-wise inference on a full-neighbour block gives the whole-graph result for its seeds."""
    g, x = graph
    model = one_layer(kind)
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
