#!/usr/bin/env bash
# The GPU side of benchmarks.compute_speed (docs/benchmarks.md, "Compute speed of a GPU"): on a
# machine with a CUDA GPU, PyTorch and this checkout (DGL and degnn's other dependencies not
# needed), time degnn's torch backend's GraphSAGE step over the batch files made by `python -m benchmarks.compute_speed
# sample`: on the GPU in every repeat, on one core of that machine in the first.
# Usage: benchmarks/compute_speed.sh BATCH_DIR OUT_DIR [REPEATS]  (writes OUT_DIR/r<k>/*.json)
set -euo pipefail
batches=${1:?the folder of sampled batch files (*.pt)}
out=${2:?the folder for the JSON measurements}
repeats=${3:-3}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv || true
for k in $(seq 1 "$repeats"); do
  mkdir -p "$out/r$k"
  for f in "$batches"/*.pt; do
    name=$(basename "$f" .pt)
    PYTHONUNBUFFERED=1 "$py" "$here/benchmarks/compute_speed.py" time "$f" --device cuda --rounds 20 --out "$out/r$k/$name-cuda.json"
    if [ "$k" = 1 ]; then
      PYTHONUNBUFFERED=1 "$py" "$here/benchmarks/compute_speed.py" time "$f" --device cpu --threads 1 --rounds 3 --out "$out/r$k/$name-cpu1.json"
    fi
  done
done
