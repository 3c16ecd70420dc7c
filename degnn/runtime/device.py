"""The one place where a trainer's device is chosen (`train.device`) and what a step computes with
is moved to it.

The graph servers, the KVStore and the samplers stay on the CPU: a batch is sampled there and
moved once (`DeviceMover`). With model.backend=dgl its DGL graphs move as DGL graphs (a GPU then
needs a CUDA build of DGL); with model.backend=torch each graph becomes its Adjacency (index
tensors and sizes, degnn.models.torch_layers) on the CPU, and those tensors move. Only the CPU
builds are installed and tested here; a CUDA run is untested (docs/limitations.md).
"""
from __future__ import annotations

import torch

from degnn.models.backend import adjacency_of, choose_backend
from degnn.models.torch_layers import Adjacency


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
                          f"train.device=cpu (a CUDA run needs a CUDA build of PyTorch)")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"train.device={name}: degnn runs on cpu or cuda")
    return dev


def _is_dgl_graph(obj) -> bool:
    return hasattr(obj, "is_block") and hasattr(obj, "edges")


class DeviceMover:
    """Moves a batch (tuples and lists of tensors and DGL graphs; anything else is kept) to
    `device` for `backend` (dgl or torch, degnn.models.backend.choose_backend), and counts the
    host-to-device copies it makes: `tensors` and `bytes` (the run's summary reports them per batch
    as device_copies_per_batch). A tensor already on the device is not copied."""

    def __init__(self, device, backend: str):
        self.device = torch.device(device)
        self.backend = backend
        self.tensors = 0
        self.bytes = 0

    @classmethod
    def of(cls, model_backend: str, device) -> "DeviceMover":
        """The mover for `model.backend` on `device`."""
        return cls(device, choose_backend(model_backend, device))

    def __call__(self, batch):
        if isinstance(batch, (list, tuple)):
            return type(batch)(self(b) for b in batch)
        if isinstance(batch, torch.Tensor):
            return self._tensor(batch)
        if isinstance(batch, Adjacency):
            return Adjacency(self._tensor(batch.src), self._tensor(batch.dst), batch.num_src, batch.num_dst,
                             batch.block)
        if _is_dgl_graph(batch):
            if self.backend == "torch":
                return self(adjacency_of(batch))
            if batch.device == self.device:
                return batch
            self.tensors += 2  # DGL copies its edges' two index arrays
            self.bytes += 2 * batch.num_edges() * batch.idtype.itemsize
            return batch.to(self.device)
        return batch

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.device:
            return t
        self.tensors += 1
        self.bytes += t.numel() * t.element_size()
        return t.to(self.device)

    def counts(self) -> dict:
        return {"tensors": self.tensors, "bytes": self.bytes}
