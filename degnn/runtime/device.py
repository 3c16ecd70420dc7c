"""The one place where a trainer's device is chosen (`train.device`) and batches are moved to it.

Only the CPU build is installed and tested here. A CUDA run needs a CUDA build of PyTorch and of
DGL (DGL's CPU wheel cannot move graphs to a GPU) and is untested: the graph servers, the
KVStore and the samplers stay on the CPU either way; models, batches' graphs and their inputs
move to the device.
"""
from __future__ import annotations

import torch


class DeviceError(ValueError):
    pass


def device_of(name: str) -> torch.device:
    """torch.device of `train.device` (cpu, cuda, cuda:N), refused when it is not usable here."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"train.device={name!r} is not a device: use cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"train.device={name}: this PyTorch has no usable CUDA device; use "
                          f"train.device=cpu (a CUDA run needs CUDA builds of PyTorch and DGL)")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"train.device={name}: degnn runs on cpu or cuda")
    return dev


def to_device(batch, device: torch.device):
    """A batch (tuples and lists of tensors and DGL graphs) on `device`; unchanged on the CPU."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    return batch.to(device) if hasattr(batch, "to") else batch
