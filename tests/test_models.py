"""The edge-index layers compute what DGL's own convolutions compute (same weights, same graph)."""
import dgl
import dgl.nn as dglnn
import pytest
import torch

from degnn.models import GNN, build_model, hops_from_blocks
from degnn.models.layers import GATLayer, GCNLayer, SAGELayer


@pytest.fixture
def graph():
    torch.manual_seed(0)
    g = dgl.to_bidirected(dgl.rand_graph(60, 300))
    g = dgl.remove_self_loop(g)
    return g, torch.randn(60, 8)


def full_hop(g):
    src, dst = g.edges()
    return src, dst, g.num_nodes()


def test_sage_matches_dgl(graph):
    g, x = graph
    ref = dglnn.SAGEConv(8, 5, "mean")
    ours = SAGELayer(8, 5)
    with torch.no_grad():
        ours.self_linear.weight.copy_(ref.fc_self.weight)
        ours.self_linear.bias.copy_(ref.fc_self.bias)
        ours.neigh_linear.weight.copy_(ref.fc_neigh.weight)
    torch.testing.assert_close(ours(x, *full_hop(g)), ref(g, x), atol=1e-5, rtol=1e-4)


def test_gcn_matches_dgl(graph):
    g, x = graph
    ref = dglnn.GraphConv(8, 5, norm="both")
    ours = GCNLayer(8, 5)
    with torch.no_grad():
        # GraphConv stores W as [in, out]
        ours.linear.weight.copy_(ref.weight.T)
        ours.linear.bias.copy_(ref.bias)
    torch.testing.assert_close(ours(x, *full_hop(g)), ref(dgl.add_self_loop(g), x), atol=1e-5, rtol=1e-4)


def test_gat_matches_dgl(graph):
    g, x = graph
    ref = dglnn.GATConv(8, 3, num_heads=2)
    ours = GATLayer(8, 6, heads=2, concat=True)
    with torch.no_grad():
        ours.linear.weight.copy_(ref.fc.weight)
        ours.att_src.copy_(ref.attn_l[0])
        ours.att_dst.copy_(ref.attn_r[0])
        ours.bias.copy_(ref.bias)
    expected = ref(dgl.add_self_loop(g), x).flatten(1)
    torch.testing.assert_close(ours(x, *full_hop(g)), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_sampled_blocks_forward_and_backward(graph, kind):
    g, x = graph
    model = GNN(kind, 8, 16, 4, layers=2, dropout=0.1)
    sampler = dgl.dataloading.NeighborSampler([3, 5])
    seeds = torch.arange(10)
    input_nodes, output_nodes, blocks = sampler.sample(g, seeds)
    out = model(hops_from_blocks(blocks), x[input_nodes])
    assert out.shape == (10, 4)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_fanouts_must_match_layers():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"name": "sage", "layers": 3, "hidden": 8, "fanouts": [10, 25], "dropout": 0.0, "heads": 1})
    with pytest.raises(ValueError, match="one fan-out per layer"):
        build_model(cfg, 4, 2)
