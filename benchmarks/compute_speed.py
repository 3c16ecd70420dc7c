"""How much faster a GPU computes degnn's training step than one core of this host: the
projection's compute-speed axis, measured (docs/benchmarks.md, "Compute speed of a GPU").

The projection (benchmarks.projection) scales every CPU phase by one speed, 1x being one core of
the calibrating host per machine. This measures where one accelerator puts the compute phase
(forward, backward and optimiser step of a sampled batch) on that axis, with the same model and
the same batches:

    python -m benchmarks.compute_speed sample FILE [--dataset wordnet] [--fanouts 15,10,5]
        [--batch-size 1024] [--batches 6]
            training batches sampled from the whole graph with DGL's NeighborSampler (as a trainer
            samples them), saved as their blocks' edge lists (int32) and sizes, with the feature
            width and classes: a small file that travels to a machine without DGL
    python -m benchmarks.compute_speed dgl FILE --out JSON
            degnn's own model (degnn.models.GNN: dgl.nn.SAGEConv) training on those blocks on this
            host's CPU, one thread: the compute phase as the projection calibrates it
    python benchmarks/compute_speed.py time FILE --device cpu|cuda [--threads 1] --out JSON
            the same GraphSAGE on degnn's plain-torch backend (degnn.models.torch_layers,
            model.backend=torch; this mode imports no DGL, so it runs from a checkout where only
            torch is installed): mean aggregation as a sparse CSR product, projecting before
            aggregating where that is narrower, as dgl.nn.SAGEConv does
    python -m benchmarks.compute_speed record FOLDER... [--records DIR]
            the measurements (*.json, one folder per repeat) as one record each in
            benchmarks/records/compute.jsonl, which
            `python -m benchmarks.results_md` turns into RESULTS.md's "bench=compute" table

Each measurement trains `--rounds` passes over the saved batches after one pass of warm-up (the
GPU's kernels load and its allocator fills then), synchronising the device before each clock
read, and reports the median step and the min-max over steps. Features are random normal values
(never zeros: they can run faster than real data) and labels random classes; the arithmetic of a
step does not depend on their values beyond that.

The torch backend is run on this host's CPU too, beside DGL's model: how far their step times
differ there says how much of a GPU's measured factor may belong to the backend rather than to
the device.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import List, Optional

import torch
from torch import nn
import torch.nn.functional as F

if not __package__:  # run as a file (python benchmarks/compute_speed.py): the checkout's degnn
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from degnn.models.torch_layers import Adjacency, SAGELayer  # noqa: E402 (imports no DGL)

FORMAT = 1  # the saved batches' layout


# --- degnn's torch backend, as a GraphSAGE stack -------------------------------------------------
class PlainSage(nn.Module):
    """degnn's `sage` model (ReLU and dropout between layers, none on the input) on degnn's
    plain-torch layers (degnn.models.torch_layers, model.backend=torch); a degnn `sage` model's
    state dict loads into it as it is."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.layers = nn.ModuleList(SAGELayer(dims[i], dims[i + 1]) for i in range(layers))
        self.dropout = dropout

    def forward(self, adjs, x):
        h = x
        for i, (layer, adj) in enumerate(zip(self.layers, adjs)):
            h = layer(adj, h)
            if i < len(self.layers) - 1:
                h = F.dropout(F.relu(h), self.dropout, self.training)
        return h


def adjacencies(batch: dict, device) -> List[Adjacency]:
    """A saved batch's hops on `device`, their mean matrices built (as DGL's blocks hold their
    formats after the first step)."""
    adjs = [Adjacency(s, d, ns, nd).to(device)
            for s, d, ns, nd in zip(batch["src"], batch["dst"], batch["num_src"], batch["num_dst"])]
    for adj in adjs:
        adj.mean_matrices()
    return adjs


# --- timing ----------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_steps(model: nn.Module, inputs: List[tuple], device: torch.device, rounds: int, lr: float = 0.01) -> List[float]:
    """Seconds of each timed training step: one untimed pass over `inputs` ((graph, x, y) per
    batch, already on `device`), then `rounds` timed passes."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()

    def step(graph, x, y):
        loss = F.cross_entropy(model(graph, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for graph, x, y in inputs:  # warm-up: kernels, allocator, optimiser state
        step(graph, x, y)
    _sync(device)
    times = []
    for _ in range(rounds):
        for graph, x, y in inputs:
            t0 = time.perf_counter()
            loss = step(graph, x, y)
            _sync(device)
            times.append(time.perf_counter() - t0)
            if not torch.isfinite(loss):
                raise RuntimeError(f"non-finite loss {loss.item()} on {device}: the step is broken")
    return times


def random_inputs(meta: dict, batch: dict, device: torch.device, gen: torch.Generator):
    x = torch.randn(batch["num_src"][0], meta["in_dim"], generator=gen)
    y = torch.randint(0, meta["num_classes"], (batch["num_dst"][-1],), generator=gen)
    return x.to(device), y.to(device)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def result(kind: str, device: torch.device, threads: int, meta: dict, times: List[float]) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {"implementation": kind, "device": device.type, "device_name": name, "threads": threads,
            "torch": torch.__version__, "dataset": meta["dataset"], "fanouts": meta["fanouts"],
            "batch_size": meta["batch_size"], "hidden": meta["hidden"], "batches": len(meta["batches"]),
            "steps": len(times), "step_ms_median": round(1000 * statistics.median(times), 3),
            "step_ms_min": round(1000 * min(times), 3), "step_ms_max": round(1000 * max(times), 3),
            "input_rows_mean": round(statistics.mean(b["num_src"][0] for b in meta["batches"]), 1),
            "edges_mean": round(statistics.mean(sum(b["edges"]) for b in meta["batches"]), 1),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def load_batches(path: str) -> dict:
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such batch file; make one with `python -m benchmarks.compute_speed sample {path}`")
    meta = torch.load(path, weights_only=False)  # our own file: lists of tensors and sizes
    if meta.get("format") != FORMAT:
        raise SystemExit(f"{path}: not a batch file of this version (format {meta.get('format')}, "
                         f"expected {FORMAT}); sample it again with `python -m benchmarks.compute_speed sample`")
    return meta


def time_plain(path: str, device_name: str, threads: int, rounds: int, seed: int) -> dict:
    """The torch backend's (degnn.models.torch_layers) training step on `device_name`."""
    meta = load_batches(path)
    torch.set_num_threads(threads)
    device = torch.device(device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for b in meta["batches"]:
        inputs.append((adjacencies(b, device), *random_inputs(meta, b, device, gen)))
    model = PlainSage(meta["in_dim"], meta["hidden"], meta["num_classes"], len(meta["fanouts"]), meta["dropout"]).to(device)
    error = check_against_float64(model, meta, inputs[0], device)
    out = result("torch", device, threads, meta, train_steps(model, inputs, device, rounds))
    out["rel_error_vs_float64"] = error
    return out


@torch.no_grad()
def check_against_float64(model: "PlainSage", meta: dict, inputs: tuple, device: torch.device) -> float:
    """||out - ref|| / ||ref|| of the model's forward pass (no dropout) on the first batch against the
    same weights in float64 on the CPU; over 1e-3 means the step computes something else: stop."""
    adjs, x, _ = inputs
    model.eval()
    out = model(adjs, x).double().cpu()
    ref_model = PlainSage(meta["in_dim"], meta["hidden"], meta["num_classes"], len(meta["fanouts"]), 0.0).double()
    ref_model.load_state_dict({k: v.double().cpu() for k, v in model.state_dict().items()})
    ref_model.eval()
    ref = ref_model(adjacencies(meta["batches"][0], "cpu"), x.double().cpu())
    model.train()
    error = float((out - ref).norm() / ref.norm())
    if not error <= 1e-3:  # NaN fails too
        raise RuntimeError(f"the step on {device} differs from float64 by {error:.2e} (over 1e-3)")
    return error


# --- the DGL side (this host) -----------------------------------------------------------------
def sample(out: str, dataset: str, fanouts: List[int], batch_size: int, batches: int, hidden: int,
           dropout: float, seed: int) -> dict:
    """Sample `batches` training batches of `dataset` and save their blocks (module docstring)."""
    import dgl
    from omegaconf import OmegaConf

    from degnn.config import CONF_DIR, DatasetConfig
    from degnn.data import load_dataset

    cfg = OmegaConf.merge(OmegaConf.structured(DatasetConfig), OmegaConf.load(Path(CONF_DIR, "dataset", f"{dataset}.yaml")))
    data = load_dataset(cfg)
    g = data.graph
    if data.task != "node":
        raise SystemExit(f"dataset {dataset}: compute_speed samples node-classification batches")
    torch.manual_seed(seed)
    train = torch.nonzero(g.ndata["train_mask"], as_tuple=True)[0]
    loader = dgl.dataloading.DataLoader(g, train, dgl.dataloading.NeighborSampler(fanouts), batch_size=batch_size,
                                        shuffle=True, drop_last=True)
    saved = []
    for _, _, blocks in loader:
        edges = [blk.edges() for blk in blocks]
        saved.append({"src": [s.int() for s, _ in edges], "dst": [d.int() for _, d in edges],
                      "num_src": [blk.num_src_nodes() for blk in blocks],
                      "num_dst": [blk.num_dst_nodes() for blk in blocks],
                      "edges": [blk.num_edges() for blk in blocks]})
        if len(saved) == batches:
            break
    meta = {"format": FORMAT, "dataset": dataset, "fanouts": list(fanouts), "batch_size": batch_size,
            "in_dim": int(g.ndata["feat"].shape[1]), "num_classes": int(data.num_classes), "hidden": hidden,
            "dropout": dropout, "batches": saved}
    torch.save(meta, out)
    return meta


def time_dgl(path: str, rounds: int, seed: int) -> dict:
    """degnn's own model (dgl.nn.SAGEConv) on the saved blocks, this host's CPU, one thread."""
    import dgl

    from degnn.models import GNN

    meta = load_batches(path)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cpu = torch.device("cpu")
    inputs = []
    for b in meta["batches"]:
        blocks = [dgl.create_block((s.long(), d.long()), num_src_nodes=ns, num_dst_nodes=nd)
                  for s, d, ns, nd in zip(b["src"], b["dst"], b["num_src"], b["num_dst"])]
        inputs.append((blocks, *random_inputs(meta, b, cpu, gen)))
    model = GNN("sage", meta["in_dim"], meta["hidden"], meta["num_classes"], len(meta["fanouts"]), meta["dropout"])
    return result("dgl", cpu, 1, meta, train_steps(model, inputs, cpu, rounds))


def suite_name(r: dict) -> str:
    """`wordnet-b1024-dgl-cpu-t1-amd-epyc`: the dataset, batch, implementation, device (threads on a
    CPU) and the device's name (this host's core and the GPU machine's are two settings)."""
    where = f"{r['device']}-t{r['threads']}" if r["device"] == "cpu" else r["device"]
    name = "-".join(re.findall(r"[a-z0-9]+", r["device_name"].lower()))
    return f"{r['dataset']}-b{r['batch_size']}-{r['implementation']}-{where}-{name}"


def record(folders: List[str], records_dir: Optional[str] = None) -> Path:
    """Every measurement (*.json) of each folder as one record in `records_dir`/compute.jsonl, in
    benchmarks.records' shape, all of one invocation: folder k is repeat k (a repeat runs each
    measurement once; the GPU's and this host's of one repeat may come from different machines)."""
    from . import RECORDS_DIR
    from .records import append_measurements

    repeats = []
    for folder in folders:
        paths = sorted(Path(folder).glob("*.json"))
        if not paths:
            raise SystemExit(f"{folder}: no *.json measurements in it")
        measured = [json.loads(path.read_text()) for path in paths]
        repeats.append([(suite_name(r), {**r, "pipeline": "compute", "status": "ok"}) for r in measured])
    return append_measurements("compute", repeats, Path(records_dir or RECORDS_DIR))


# --- the report's table (RESULTS.md, bench=compute) ------------------------------------------
def compute_section(runs: List[dict]) -> List[str]:
    """The step times of every implementation and device per dataset and batch size, over the
    repeats, and the GPU's speed on the projection's axis: this host's one core running degnn's
    DGL model over the GPU's step."""
    from .spread import cell, spread

    by: dict = {}
    edges: dict = {}  # edges per batch of a dataset and batch size (the same batch files throughout)
    for r in runs:
        if r.get("pipeline") == "compute" and r.get("step_ms_median"):
            group = (r["dataset"], r["batch_size"])
            by.setdefault(group, {}).setdefault(
                (r["implementation"], r["device"], r["device_name"], r["threads"]), []).append(r["step_ms_median"])
            edges.setdefault(group, r["edges_mean"])
    if not by:
        return []
    rows = []
    for (dataset, batch), sides in sorted(by.items()):
        base = next((spread(v) for (impl, dev, _, t), v in sides.items() if impl == "dgl" and dev == "cpu" and t == 1),
                    None)
        for (impl, dev, name, threads), ms in sorted(sides.items(), key=lambda kv: -statistics.median(kv[1])):
            s = spread(ms)
            speed = "–"
            if base and dev == "cuda":
                speed = f"**{base.median / s.median:.0f}x** ({base.lo / s.hi:.0f}–{base.hi / s.lo:.0f})"
            elif base:
                speed = f"{base.median / s.median:.2f}x"
            who = "degnn's model (dgl.nn.SAGEConv)" if impl == "dgl" else "plain-torch stand-in"
            rows.append(f"| {dataset} | {batch} | {edges[(dataset, batch)]:,.0f} | {who} | {name}"
                        f"{f', {threads} thread' + ('s' if threads > 1 else '') if dev == 'cpu' else ''} | "
                        f"{cell(s, '.1f')} | {s.n} | {speed} |")
    return ["## Compute speed of a GPU", "",
            "One training step (forward, backward, Adam) of 3-layer GraphSAGE over the same sampled "
            "batches (benchmarks.compute_speed), the median step of each measurement; over repeats "
            "the median (min–max). Speed = this host's one core running degnn's own model over that "
            "row's step: where the row sits on the projection's speed axis (1x = one core of this "
            "host; the bold GPU ranges pair the extremes of both sides). The plain-torch stand-in "
            "runs where DGL is not installed; its CPU rows say how close it is to DGL's kernels.", "",
            "| dataset | batch | edges/batch | model | device | step ms | repeats | speed |",
            "|---|---|---|---|---|---|---|---|", *rows, ""]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compute_speed", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="sample training batches and save their blocks (needs DGL)")
    s.add_argument("file")
    s.add_argument("--dataset", default="wordnet")
    s.add_argument("--fanouts", default="15,10,5")
    s.add_argument("--batch-size", type=int, default=1024)
    s.add_argument("--batches", type=int, default=6)
    s.add_argument("--hidden", type=int, default=128)
    s.add_argument("--dropout", type=float, default=0.5)
    s.add_argument("--seed", type=int, default=0)
    for name, help_ in (("time", "time the plain-torch step (torch only)"), ("dgl", "time degnn's DGL model on this CPU")):
        t = sub.add_parser(name, help=help_)
        t.add_argument("file")
        t.add_argument("--out", required=True, help="the measurement as JSON")
        t.add_argument("--rounds", type=int, default=5)
        t.add_argument("--seed", type=int, default=0)
        if name == "time":
            t.add_argument("--device", default="cpu")
            t.add_argument("--threads", type=int, default=1)
    r = sub.add_parser("record", help="append measurements to benchmarks/records/compute.jsonl")
    r.add_argument("folders", nargs="+", help="one folder of *.json measurements per repeat")
    r.add_argument("--records", default=None, help="default: the checkout's benchmarks/records")
    args = ap.parse_args(argv)
    if args.cmd == "sample":
        meta = sample(args.file, args.dataset, [int(f) for f in args.fanouts.split(",")], args.batch_size,
                      args.batches, args.hidden, args.dropout, args.seed)
        print(f"{args.file}: {len(meta['batches'])} batches of {args.dataset}, "
              f"{sum(sum(b['edges']) for b in meta['batches']) / len(meta['batches']):.0f} edges a batch")
        return 0
    if args.cmd == "record":
        print(record(args.folders, args.records))
        return 0
    res = time_plain(args.file, args.device, args.threads, args.rounds, args.seed) if args.cmd == "time" \
        else time_dgl(args.file, args.rounds, args.seed)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['implementation']} on {res['device_name']} ({res['threads']} threads): step "
          f"{res['step_ms_median']} ms median ({res['step_ms_min']}-{res['step_ms_max']}) over {res['steps']} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
