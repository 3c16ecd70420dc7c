"""Reading the DGL partition JSON (the launcher's preflight and the trainers use it)."""
from __future__ import annotations

import json
from pathlib import Path


def read_partition_json(path) -> dict:
    path = Path(path)
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"partition config {path} not found: partition the dataset first "
                                f"(python -m partitioners ...) or fix the path") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"partition config {path} is not valid JSON ({e}): re-create the partitions") from None
    for key in ("graph_name", "num_parts"):
        if key not in meta:
            raise ValueError(f"partition config {path} has no '{key}': it is not a DGL partition JSON")
    return meta
