"""A plain DGL distributed GraphSAGE trainer: the reference that `bench=parity` holds
`pipeline=distdgl` against.

It stands in for DGL's own distributed GraphSAGE example: DistGraph, DistNodeDataLoader with a
NeighborSampler, features pulled with `g.ndata["feat"][input_nodes]`, `dgl.nn.SAGEConv`, DDP
over gloo, Adam; after the last epoch one layer-wise full-neighbour inference scores validation
and test accuracy. No degnn code runs in the training loop: degnn only reads the run's settings
(so both sides get the same fan-outs, batch size, seed, ...) and writes summary.json.

Started by the launcher in place of degnn.train on the same cluster and partitions:
`python -m degnn.launch cluster.entry=benchmarks.plain_dgl ...`.
"""
from __future__ import annotations

import os
import sys
import time

import dgl
import dgl.nn as dglnn
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class SAGE(nn.Module):
    def __init__(self, in_dim, hidden, out_dim, layers, dropout):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.layers = nn.ModuleList(dglnn.SAGEConv(dims[i], dims[i + 1], "mean") for i in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h

    @torch.no_grad()
    def inference(self, g, nodes, batch_size):
        """Layer by layer over every node with all neighbours, results in DistTensors."""
        x = g.ndata["feat"]
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
        for i, layer in enumerate(self.layers):
            out_dim = layer._out_feats
            y = dgl.distributed.DistTensor((g.num_nodes(), out_dim), torch.float32, f"plain_h{i}",
                                           persistent=True)
            loader = dgl.dataloading.DistNodeDataLoader(g, nodes, sampler, batch_size=batch_size)
            for input_nodes, output_nodes, blocks in loader:
                h = layer(blocks[0], x[input_nodes])
                y[output_nodes] = F.relu(h) if i < len(self.layers) - 1 else h
            g.barrier()
            x = y
        return x


def tx_bytes() -> int:
    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    path = f"/sys/class/net/{iface}/statistics/tx_bytes"
    return int(open(path).read()) if iface and os.path.exists(path) else 0


def accuracy(g, logits, mask_name, pb) -> float:
    nids = dgl.distributed.node_split(g.ndata[mask_name], pb, force_even=True)
    hits = (logits[nids].argmax(1) == g.ndata["label"][nids].long()).sum()
    counts = torch.tensor([float(hits), float(len(nids))])
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def main(argv) -> int:
    from degnn.metrics import write_summary
    from degnn.compat import strip_local_rank
    from degnn.entry import compose_config, run_dir_from
    from degnn.runtime.partition_info import read_partition_json

    overrides, _ = strip_local_rank(argv)
    cfg = compose_config(overrides)
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])  # a server never returns from here
    dist.init_process_group("gloo")
    meta = read_partition_json(os.environ["DGL_CONF_PATH"])
    g = dgl.distributed.DistGraph(meta["graph_name"], part_config=os.environ["DGL_CONF_PATH"])
    pb = g.get_partition_book()
    train_nids = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    num_classes = torch.tensor([int(g.ndata["label"][train_nids].max()) + 1])
    dist.all_reduce(num_classes, op=dist.ReduceOp.MAX)

    torch.manual_seed(cfg.train.seed)
    model = SAGE(g.ndata["feat"].shape[1], cfg.model.hidden, int(num_classes), cfg.model.layers,
                 cfg.model.dropout)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    loader = dgl.dataloading.DistNodeDataLoader(
        g, train_nids, dgl.dataloading.NeighborSampler(list(cfg.model.fanouts)),
        batch_size=cfg.train.batch_size, shuffle=True, drop_last=False)

    epoch_times, batches, wire = [], 0, 0
    for epoch in range(1, cfg.train.epochs + 1):
        t0, tx0 = time.time(), tx_bytes()
        for input_nodes, seeds, blocks in loader:
            x = g.ndata["feat"][input_nodes]
            y = g.ndata["label"][seeds].long()
            loss = F.cross_entropy(ddp(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            batches += 1
        epoch_times.append(time.time() - t0)
        wire += tx_bytes() - tx0
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}, {epoch_times[-1]:.2f}s", flush=True)

    model.eval()
    nodes = dgl.distributed.node_split(torch.ones(g.num_nodes(), dtype=torch.bool), pb, force_even=True)
    logits = model.inference(g, nodes, cfg.train.eval_batch_size)
    val, test = accuracy(g, logits, "val_mask", pb), accuracy(g, logits, "test_mask", pb)

    totals = torch.tensor([float(batches), float(wire)])
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        batches_all, wire_all = int(totals[0]), float(totals[1])
        write_summary(run_dir_from(overrides), {
            "pipeline": "plain-dgl", "variant": "default", "dataset": cfg.dataset.name, "task": "node",
            "metric": "acc", "model": "sage", "layers": cfg.model.layers, "hidden": cfg.model.hidden,
            "machines": meta["num_parts"], "trainers": dist.get_world_size(),
            "best_val": val, "test": test, "test_final": test, "epochs": cfg.train.epochs,
            "train_time_s": round(sum(epoch_times), 3),
            "epoch_time_s": round(sum(epoch_times) / len(epoch_times), 3),
            "epoch_times_s": [round(t, 3) for t in epoch_times], "batches": batches_all,
            "fanouts": list(cfg.model.fanouts),
            "app_bytes_per_batch": None, "allreduce_bytes_per_batch": None,
            "net_bytes_train": int(wire_all) if os.environ.get("GLOO_SOCKET_IFNAME") else None,
            "net_bytes_per_batch": (wire_all / batches_all) if os.environ.get("GLOO_SOCKET_IFNAME") else None,
            "net_bytes_total": None, "status": "ok"})
        print(f"plain-dgl: val {val:.4f} test {test:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
