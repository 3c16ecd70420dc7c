"""Every process of an inference cluster (`python -m degnn.infer.worker infer.run=RUN_DIR ...`).

Started by degnn.infer's command through the launcher, with the same roles and environment as a
training run. A server serves its partition (degnn.entry.run_server). A trainer loads the run's
best model, runs the layer-wise full-neighbour pass over every node (DistEvaluator.inference),
scores validation and test as the run's evaluation did, and, as its machine's first trainer, writes
its machine's own nodes (the partition's contiguous range of new ids, with their original ids from
orig_nids.pt) to part<i>.pt in the output folder (the launcher's run directory, hydra.run.dir).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import List

from degnn.infer import PART_FILE, SUMMARY
from degnn.infer.run import ORIG_NIDS, InferError, load_best_model, run_config
from degnn.startup import pause_collector, resume_collector

log = logging.getLogger("degnn")

SOURCE_KEY = "infer.run"


def split_argv(argv: List[str]) -> tuple:
    """(run directory, output folder, config overrides) of a worker's command line."""
    run_dir = out = None
    rest = []
    for a in argv:
        key, _, value = a.partition("=")
        if key == SOURCE_KEY:
            run_dir = Path(value)
        elif key == "hydra.run.dir":
            out = Path(value).resolve()
        else:
            rest.append(a)
    if run_dir is None or out is None:
        raise InferError(f"{SOURCE_KEY}= and hydra.run.dir= are missing: start inference with "
                         f"python -m degnn.infer RUN_DIR, not this module")
    return run_dir, out, rest


def _atomic_save(obj, path: Path) -> None:
    import torch

    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def machine_rows(ctx, outputs, task_name: str, orig_nids) -> dict:
    """This machine's own nodes: their original ids and what is written of each."""
    pb = ctx.graph.get_partition_book()
    nids = pb.partid2nids(pb.partid)  # its contiguous range of new ids
    rows = {"orig_ids": orig_nids[nids].long()}
    rows["embedding"] = outputs[embedding_layer(task_name, len(outputs))][nids].float()
    if task_name == "node":
        logits = outputs[-1][nids].float()
        rows["logits"] = logits
        rows["pred"] = logits.argmax(1).long()
    return rows


def embedding_layer(task_name: str, layers: int) -> int:
    """Which layer's output is the embedding: node task, the last hidden layer (a one-layer model
    has none: its output); link task, the encoder's output."""
    return -2 if task_name == "node" and layers > 1 else -1


def describe_embedding(task_name: str, layers: int) -> str:
    if task_name != "node":
        return "the encoder's output"
    return "the last hidden layer" if layers > 1 else "the model's output"


def state_mismatch(own: dict, saved: dict) -> str:
    """Why a saved state_dict does not load into a model's (empty when it does)."""
    missing = [k for k in own if k not in saved]
    if missing:
        return f"no {missing[0]} in the file" + (f", {len(missing) - 1} more missing" if len(missing) > 1 else "")
    extra = [k for k in saved if k not in own]
    if extra:
        return f"the file has {extra[0]}, the model none"
    for k, t in own.items():
        if tuple(saved[k].shape) != tuple(t.shape):
            return f"{k} is {list(saved[k].shape)} in the file, {list(t.shape)} in the model"
    return ""


def run_trainer(run_dir: Path, out: Path, cfg) -> int:
    import dgl
    import torch
    import torch.distributed as dist

    from degnn.entry import require_env, setup_logging
    from degnn.runtime import services
    from degnn.runtime.context import RunContext
    from degnn.runtime.device import device_of
    from degnn.runtime.heartbeat import Heartbeat, heartbeat_path
    from degnn.runtime.partition_info import read_partition_json
    from degnn.runtime.rendezvous import wait_for_servers
    from degnn.runtime.store import init_process_group
    from degnn.tasks import task_of

    require_env("DGL_CONF_PATH", "DGL_IP_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    setup_logging(out, f"rank{rank}", to_console=rank == 0)
    heartbeat = Heartbeat(heartbeat_path(out, f"rank{rank}")).start()
    part_config = Path(os.environ["DGL_CONF_PATH"])
    meta = read_partition_json(part_config)
    best = load_best_model(run_dir)
    orig_nids = torch.load(part_config.parent / ORIG_NIDS, map_location="cpu", weights_only=True)
    task = task_of(cfg)
    services.register(cfg.pipeline.services)  # as the servers did (the same config)
    t0 = time.time()
    wait_for_servers()
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    # inference needs no fault tolerance: every pipeline's trainers meet in gloo here
    init_process_group(rank, world, timeout=datetime.timedelta(minutes=30))
    graph = dgl.distributed.DistGraph(meta["graph_name"], part_config=str(part_config))
    ctx = RunContext(cfg=cfg, run_dir=out, rank=rank, world_size=world, local_rank=local_rank,
                     machines=meta["num_parts"], part_config=part_config, graph=graph, log=log,
                     heartbeat=heartbeat, device=device_of(cfg.train.device))
    task.prepare(ctx)
    model = task.build_model(graph.ndata["feat"].shape[1])
    why = state_mismatch(model.state_dict(), best["model"])
    if why:
        raise InferError(f"{run_dir}/best_model.pt does not fit the model of its config.yaml ({why}); "
                         f"the run directory mixes files of different runs: train it again")
    model.load_state_dict(best["model"])
    model = model.to(ctx.device)
    log.info("inference of %s (best model of epoch %s): %d nodes, %d machines, up in %.1fs", run_dir,
             best.get("epoch"), graph.num_nodes(), meta["num_parts"], time.time() - t0)
    evaluator = task.evaluator(ctx, model)
    resume_collector()  # start-up is over (degnn/startup.py)
    t1 = time.time()
    outputs = evaluator.inference()
    val, test = evaluator.score(outputs[-1], model, evaluator.evaluate_fn)
    infer_s = time.time() - t1
    if local_rank == 0:  # one writer per machine: its own nodes
        rows = machine_rows(ctx, outputs, task.name, orig_nids)
        path = out / PART_FILE.format(int(graph.get_partition_book().partid))
        _atomic_save(rows, path)
        log.info("wrote %d nodes to %s", len(rows["orig_ids"]), path)
    dist.barrier()
    if rank == 0:
        summary_of_run = {}
        try:
            summary_of_run = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        dims = {"embedding": int(outputs[embedding_layer(task.name, len(outputs))].shape[1])}
        if task.name == "node":
            dims["logits"] = int(outputs[-1].shape[1])
        info = {"run": str(run_dir.resolve()), "pipeline": cfg.pipeline.name,
                "variant": cfg.pipeline.get("variant"), "dataset": cfg.dataset.name,
                "task": task.name, "metric": task.metric, "machines": meta["num_parts"],
                "trainers": world, "num_nodes": int(graph.num_nodes()),
                "num_parts": int(meta["num_parts"]),
                "files": [PART_FILE.format(i) for i in range(meta["num_parts"])],
                "fields": ["orig_ids", "embedding", *(["logits", "pred"] if task.name == "node" else [])],
                "dims": dims,
                "embedding": describe_embedding(task.name, len(outputs)),
                "best_epoch": best.get("epoch"), "best_val": val, "test": test,
                "run_best_val": summary_of_run.get("best_val"), "run_test": summary_of_run.get("test"),
                "infer_s": round(infer_s, 3), "status": "ok"}
        _atomic_save_json(info, out / SUMMARY)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _atomic_save_json(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def main(argv: List[str] | None = None) -> int:
    pause_collector()  # until start-up is over (degnn/startup.py): run_server and run_trainer resume it
    from degnn.entry import EntryError, run_server
    from degnn.runtime.store import ProcessGroupError

    argv = list(sys.argv[1:] if argv is None else argv)
    role = os.environ.get("DGL_ROLE", "client")
    try:
        run_dir, out, overrides = split_argv(argv)
        cfg = run_config(run_dir, overrides)
        if role == "server":
            run_server(cfg, out)
            return 0
        return run_trainer(run_dir, out, cfg)
    except (InferError, EntryError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        if role == "server":
            return 2
        os._exit(2)  # maybe after DGL's initialisation: leave without its exit barrier
    except ProcessGroupError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        print(f"error: {role} process of degnn.infer failed (traceback above)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
