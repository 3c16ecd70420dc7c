"""The marks a launcher leaves on the host, which clean-up finds again when the launcher is gone:
the environment mark of holder processes, and the registry of non-isolated local runs in the
host's /dev/shm (`degnn-local-<launcher pid>`, a JSON file with the run directory and graph name).

isolate.py writes the registry, netns.py and isolate.py mark their holders, cleanup.py reads both.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import List

SHM = "/dev/shm"
REGISTRY_PREFIX = "degnn-local-"
# environment mark of holder processes: the launcher they belong to (cleanup finds orphans by it)
HOLDER_ENV = "DEGNN_HOLDER_OF"


def registry_path(pid: int) -> Path:
    return Path(SHM, f"{REGISTRY_PREFIX}{pid}")


def registered() -> List[dict]:
    out = []
    try:
        names = os.listdir(SHM)
    except OSError:
        return out
    for name in names:
        if not name.startswith(REGISTRY_PREFIX):
            continue
        try:
            pid = int(name[len(REGISTRY_PREFIX):])
        except ValueError:
            continue
        path = Path(SHM, name)
        try:
            info = json.loads(path.read_text())
            info["started"] = path.stat().st_mtime
        except (OSError, ValueError):
            info = {"started": time.time()}
        info["pid"], info["path"] = pid, str(path)
        out.append(info)
    return out
