"""Which implementation runs the model's message passing (`model.backend`), and the DGL graph ->
Adjacency step the plain-torch layers need.

dgl: DGL's own layers (dgl.nn) over DGL blocks; on a GPU only with a CUDA build of DGL.
torch: degnn.models.torch_layers over the blocks' index tensors; runs wherever PyTorch does.
auto: torch when the model's device is a GPU and this DGL cannot put a graph there (DGL's PyPI
wheels are CPU-only), else dgl. Sampling, the KVStore and the graph servers stay on the CPU either
way; only message passing runs on the device.
"""
from __future__ import annotations

import functools

import torch

from degnn.models.torch_layers import Adjacency

BACKENDS = ("dgl", "torch", "auto")


def check_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ValueError(f"model.backend={name}: choose dgl (DGL's layers), torch (plain-torch layers, any "
                         f"device) or auto (torch on a GPU that this DGL cannot use, else dgl)")


@functools.lru_cache(maxsize=None)
def dgl_has_cuda() -> bool:
    """Whether this DGL build can hold a graph on a GPU (its CPU wheels raise on .to('cuda'))."""
    if not torch.cuda.is_available():
        return False
    import dgl

    try:
        dgl.graph(([0], [0])).to("cuda")
    except Exception:  # DGLError: "Device API cuda is not enabled", or whatever a build says
        return False
    return True


def choose_backend(name: str, device) -> str:
    """dgl or torch for `model.backend=name` on `device`; dgl on a GPU it cannot use is refused."""
    check_backend(name)
    on_gpu = torch.device(device).type == "cuda"
    if name == "auto":
        return "torch" if on_gpu and not dgl_has_cuda() else "dgl"
    if name == "dgl" and on_gpu and not dgl_has_cuda():
        raise ValueError(f"model.backend=dgl on {device}: this DGL is a CPU build; use model.backend=torch "
                         f"(or auto), or install a CUDA build of DGL")
    return name


def adjacency_of(graph) -> Adjacency:
    """A DGL block's (or whole graph's) structure as an Adjacency, on the graph's device."""
    if isinstance(graph, Adjacency):
        return graph
    src, dst = graph.edges()
    if graph.is_block:
        return Adjacency(src, dst, graph.num_src_nodes(), graph.num_dst_nodes(), block=True)
    return Adjacency(src, dst, graph.num_nodes(), graph.num_nodes(), block=False)
