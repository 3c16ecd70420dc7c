"""The accuracy reference: the same model trained in one process on the whole graph.

`python -m benchmarks.single_process dataset=wordnet model.layers=2 ...` (same config as
degnn.launch). Same split, same model, same sampler fan-outs and batch size, trained until the
validation metric stops improving (train.patience), best-validation model, full-neighbour
inference for validation and test. Writes summary.json and curve.jsonl like a distributed run
(pipeline "single"), so the benchmark report puts it in the same table.
"""
from __future__ import annotations

import copy
import logging
import os
import resource
import sys
import time
from pathlib import Path

import dgl
import hydra
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm

from degnn.config import CONF_DIR, register_configs
from degnn.data import DatasetError, load_dataset
from degnn.metrics import append_curve, result_line, write_summary
from degnn.models import build_model

log = logging.getLogger("degnn.single")


@torch.no_grad()
def full_graph_logits(model, graph) -> torch.Tensor:
    """Layer-wise full-neighbour inference on the whole graph (every node is a destination)."""
    model.eval()
    h = graph.ndata["feat"]
    for i in range(model.num_layers):
        h = model.layer_forward(i, graph, h)
    model.train()
    return h


def train_single(cfg, run_dir: Path) -> dict:
    # one thread, like each trainer of a launched cluster (DGL's launch.py gives a trainer
    # cores / 2 / trainers threads); torch's default oversubscribes the 2-core machines
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    torch.manual_seed(cfg.train.seed)
    data = load_dataset(cfg.dataset)
    if data.task != "node":
        raise ValueError("the single-process reference trains node classification only")
    g = data.graph
    train_nids = torch.nonzero(g.ndata["train_mask"], as_tuple=True)[0]
    val_nids = torch.nonzero(g.ndata["val_mask"], as_tuple=True)[0]
    test_nids = torch.nonzero(g.ndata["test_mask"], as_tuple=True)[0]
    labels = g.ndata["label"].long()
    model = build_model(cfg.model, g.ndata["feat"].shape[1], data.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    loader = dgl.dataloading.DataLoader(g, train_nids, dgl.dataloading.NeighborSampler(list(cfg.model.fanouts)),
                                        batch_size=cfg.train.batch_size, shuffle=True, drop_last=False)
    best = {"val": None, "test": None, "epoch": None, "state": None}
    train_time, epoch_times, batches, bad, last_test, epoch = 0.0, [], 0, 0, None, 0
    wall0 = time.time()
    for epoch in range(1, cfg.train.epochs + 1):
        t0, total, n = time.time(), 0.0, 0
        for input_nodes, seeds, blocks in tqdm(loader, desc=f"epoch {epoch}", leave=False, mininterval=1.0):
            out = model(blocks, g.ndata["feat"][input_nodes])
            loss = F.cross_entropy(out, labels[seeds])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item(), n + 1
        dt = time.time() - t0
        train_time += dt
        epoch_times.append(dt)
        batches += n
        record = {"epoch": epoch, "train_time_s": round(train_time, 3), "wall_s": round(time.time() - wall0, 3),
                  "loss": total / max(n, 1)}
        stop = False
        if epoch % cfg.train.eval_every == 0 or epoch == cfg.train.epochs:
            pred = full_graph_logits(model, g).argmax(1)
            val = data.evaluate(labels[val_nids], pred[val_nids])
            test = data.evaluate(labels[test_nids], pred[test_nids])
            record.update(val=val, test=test)
            last_test = test
            if best["val"] is None or val > best["val"]:
                best = {"val": val, "test": test, "epoch": epoch, "state": copy.deepcopy(model.state_dict())}
                bad = 0
            else:
                bad += 1
                stop = cfg.train.patience > 0 and bad >= cfg.train.patience
            log.info("epoch %d: loss %.4f, %.1fs, val %.4f, test %.4f", epoch, record["loss"], dt, val, test)
        append_curve(run_dir, record)
        if stop:
            break
    torch.save({"model": best["state"], "epoch": best["epoch"]}, run_dir / "best_model.pt")
    summary = {
        "pipeline": "single", "variant": "default", "dataset": cfg.dataset.name, "task": "node",
        "metric": data.metric, "model": cfg.model.name, "layers": cfg.model.layers, "hidden": cfg.model.hidden,
        "machines": 1, "trainers": 1, "best_val": best["val"], "test": best["test"], "test_final": last_test,
        "best_epoch": best["epoch"], "train_time_s": round(train_time, 3), "epochs": epoch,
        "epoch_time_s": round(sum(epoch_times) / len(epoch_times), 3), "batches": batches,
        "app_bytes_per_batch": 0.0, "allreduce_bytes_per_batch": 0.0, "net_bytes_total": None,
        "net_bytes_per_batch": None, "peak_rss_mb_trainer": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "status": "ok",
    }
    write_summary(run_dir, summary)
    return summary


register_configs()


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        summary = train_single(cfg, run_dir)
    except (DatasetError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(result_line(summary), flush=True)


if __name__ == "__main__":
    main()
