"""Checkpoints of a run directory, and the checks before `resume=` uses one.

`checkpoint.pt` (rank 0 writes it every `train.checkpoint_every` epochs) holds
  model      the unwrapped model's state_dict
  optimizer  the optimizer's state_dict
  state      the epoch loop's counters (plain numbers, lists, dicts)
  rng        one entry per trainer rank: torch, numpy and python RNG states as tensors/numbers
  config     what the checkpoint's shapes depend on (IDENTITY_KEYS -> value)
Everything in it is a tensor, a number, a string, a list or a dict, so it is read with
`torch.load(weights_only=True)`: a checkpoint from someone else cannot run code when loaded.

`check_resume(cfg, trainers)` is the launcher's preflight (before anything starts) and the
trainers' own check: each failure is one line naming the file and the fix (CheckpointError).

`save_atomic(path, obj)` writes a checkpoint (or the best model) whole or not at all: serialized
in memory first, so a full disk is an OSError of a plain write (not torch's stream error) whose
size is known, then written to `<name>.tmp` and renamed over the old file. Where the write fails
the temporary file goes and the old file stays; the error says the disk is full, the path and
the bytes it needed.
"""
from __future__ import annotations

import errno
import io
import os
import pickle
from pathlib import Path
from typing import Dict, Optional

from degnn.compat import WEIGHTS_ONLY_REFUSED

CHECKPOINT = "checkpoint.pt"
BEST_MODEL = "best_model.pt"
CONFIG_FILE = "config.yaml"

# the config values a checkpoint's tensors (or meaning) depend on; a resumed run must match them
IDENTITY_KEYS = ("dataset.name", "dataset.feat_dim", "dataset.num_classes", "pipeline.name",
                 "pipeline.variant", "model.name", "model.layers", "model.hidden", "model.heads")
REQUIRED = ("model", "optimizer", "state", "rng")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message is one line with the fix."""


def save_atomic(path, obj: dict) -> None:
    """`obj` to `path` by torch.save, replacing the old file in one rename; CheckpointError (one
    line) where it cannot be written, the old file and no temporary file left."""
    import torch

    path = Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:  # (no fsync: it doubled a 50 MB checkpoint's time; a full
            f.write(data)            # disk shows in write, or in close on NFS, both caught here)
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        kept = f"the previous {path.name} is kept" if path.exists() else f"no {path.name} was written"
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                st = os.statvfs(path.parent)
                free = f", {st.f_bavail * st.f_frsize} free"
            except OSError:
                free = ""
            raise CheckpointError(f"{path} not written: the disk is full (it needs {len(data)} bytes"
                                  f"{free}); {kept}; free space or pick another hydra.run.dir") from None
        raise CheckpointError(f"{path} not written ({e.strerror or e}); {kept}") from None


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return None
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
    return node


def config_identity(cfg) -> Dict[str, object]:
    """IDENTITY_KEYS of a config (heads only matters for GAT), as plain values."""
    out = {}
    for k in IDENTITY_KEYS:
        if k == "model.heads" and _get(cfg, "model.name") != "gat":
            continue
        v = _get(cfg, k)
        out[k] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    return out


def load_checkpoint(path) -> dict:
    """torch.load(weights_only=True) with one-line errors that name the file."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist: the run never finished an epoch; "
                              f"start a new run (without resume=)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        m = WEIGHTS_ONLY_REFUSED.search(str(e))
        if m:
            raise CheckpointError(
                f"{path} refers to {m.group(1)}, not only to tensors and numbers (refused: loading "
                f"it could run code); it is not a checkpoint of this degnn version: start a new run "
                f"(without resume=)") from None
        raise CheckpointError(f"{path} is damaged or not a checkpoint (unreadable pickle); start a "
                              f"new run (without resume=) or resume from another run") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path} is truncated or damaged ({type(e).__name__}: "
                              f"{first.split('. ')[0][:100]}); "
                              f"start a new run (without resume=) or resume from another run") from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED):
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{path} is not a degnn checkpoint (holds {keys}, expected "
                              f"{', '.join(REQUIRED)}); pass the run directory of a degnn run")
    return ckpt


def _saved_identity(run_dir: Path, ckpt: dict) -> tuple:
    """(identity, file it came from): the checkpoint's own record, else the run's config.yaml."""
    if isinstance(ckpt.get("config"), dict):
        return ckpt["config"], run_dir / CHECKPOINT
    cfg_file = run_dir / CONFIG_FILE
    if cfg_file.is_file():
        from omegaconf import OmegaConf

        try:
            return config_identity(OmegaConf.load(cfg_file)), cfg_file
        except Exception:  # noqa: BLE001 - a damaged config.yaml: nothing to compare with
            pass
    return None, None


def check_resume(cfg, trainers: Optional[int] = None) -> dict:
    """Checks `resume=<dir>` against this run's config; returns the loaded checkpoint."""
    resume = _get(cfg, "resume")
    d = Path(str(resume)).expanduser()
    if not d.is_dir():
        raise CheckpointError(f"resume={resume}: no such directory; pass the run directory of an "
                              f"earlier run (it holds {CHECKPOINT})")
    path = d / CHECKPOINT
    if not path.is_file():
        raise CheckpointError(f"resume={resume}: no {CHECKPOINT} in {d}: that run never finished an "
                              f"epoch; start a new run (without resume=)")
    ckpt = load_checkpoint(path)
    saved, source = _saved_identity(d, ckpt)
    if saved is not None:
        mine = config_identity(cfg)
        for k, v in mine.items():
            if k in saved and saved[k] != v:
                raise CheckpointError(
                    f"resume={resume}: {source} was written with {k}={saved[k]}, this run has "
                    f"{k}={v}; resume with {k}={saved[k]} or start a new run (without resume=)")
    rngs = ckpt["rng"]
    if trainers is not None and isinstance(rngs, list) and len(rngs) != trainers:
        raise CheckpointError(
            f"resume={resume}: {path} holds the state of {len(rngs)} trainers, this run starts "
            f"{trainers}; resume with the same cluster.machines x cluster.trainers_per_machine")
    return ckpt
