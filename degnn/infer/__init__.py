"""Node embeddings and predictions of a finished run (`python -m degnn.infer RUN_DIR`).

The command (__main__.py) starts the run's cluster again from its saved config, with every
process running worker.py: the graph servers serve the run's partitions, the trainers load the
run's best model (best_model.pt) and compute every node's layers with full neighbourhoods,
layer-wise (degnn.tasks.evaluation.DistEvaluator, the pass the run's own evaluation made), and the
first trainer of each machine writes its machine's nodes to `part<i>.pt` in the output folder
(RUN_DIR/embeddings/ by default):

    orig_ids   int64 [n_i]      the nodes' ids in the dataset (before partitioning renumbered them)
    embedding  float32 [n_i, d] node task: the last hidden layer (the input of the last layer, after
                                its activation; a one-layer model has none: its output);
                                link task: the encoder's output (what the decoder reads)
    logits     float32 [n_i, C] node task only: the model's output
    pred       int64 [n_i]      node task only: argmax of the logits (the predicted class)

Rank 0 also writes summary.json there: what was written, and the validation and test metric
of the best model recomputed from this pass. `load_embeddings(folder)` reads every machine's file
back into one tensor ordered by original node id.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

PART_FILE = "part{}.pt"
SUMMARY = "summary.json"
FIELDS = ("embedding", "logits", "pred")


class EmbeddingsError(RuntimeError):
    """Embedding files that cannot be read back; the message is one line with the fix."""


def load_all(folder) -> Dict[str, object]:
    """Every field of every machine's file, rows ordered by original node id (row i: node i).

    Checks that the files cover every node of the graph exactly once."""
    import torch

    folder = Path(folder)
    info_path = folder / SUMMARY
    if not info_path.is_file():
        raise EmbeddingsError(f"{folder} holds no {SUMMARY}: not an output folder of degnn.infer "
                              f"(or it did not finish); run python -m degnn.infer RUN_DIR")
    info = json.loads(info_path.read_text())
    if info.get("status") != "ok":
        raise EmbeddingsError(f"{folder}: the inference failed ({info.get('error', 'no error recorded')}); "
                              f"its logs are in that folder; run python -m degnn.infer again")
    n, parts = int(info["num_nodes"]), int(info["num_parts"])
    out: Dict[str, object] = {}
    seen = torch.zeros(n, dtype=torch.int64)
    for i in range(parts):
        path = folder / PART_FILE.format(i)
        if not path.is_file():
            raise EmbeddingsError(f"{path} is missing ({parts} machines wrote this folder); run "
                                  f"python -m degnn.infer again")
        rows = torch.load(path, map_location="cpu", weights_only=True)
        ids = rows["orig_ids"].long()
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise EmbeddingsError(f"{path} holds node ids outside 0..{n - 1}: it belongs to another "
                                  f"graph; run python -m degnn.infer again")
        seen += torch.bincount(ids, minlength=n)
        for key in FIELDS:
            if key not in rows:
                continue
            t = rows[key]
            if key not in out:
                out[key] = torch.zeros((n, *t.shape[1:]), dtype=t.dtype)
            out[key][ids] = t
    missing, twice = int((seen == 0).sum()), int((seen > 1).sum())
    if missing or twice:
        raise EmbeddingsError(f"{folder}: {missing} nodes have no row and {twice} more than one "
                              f"(files of different runs?); run python -m degnn.infer again")
    return out


def load_embeddings(folder, field: str = "embedding"):
    """One field ("embedding", "logits" or "pred") of every node, row i = original node id i."""
    data = load_all(folder)
    if field not in data:
        raise EmbeddingsError(f"{folder} has no {field!r} (it has {', '.join(data)}); link "
                              f"prediction runs write embeddings only")
    return data[field]
