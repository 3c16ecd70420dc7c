"""Every tensor a training step computes with is on train.device: checked on this CPU-only host
with a faked GPU.

`FakeGPU` is a torch function mode that keeps track of which tensors would be on the GPU in a real
run: those a `.to("cuda")` made (it stands in for the copy: a clone), the model's parameters
(model.to moves them), tensors a factory made with an explicit `device=` (our code passes the
device of a tensor it has), and the results of operations whose tensor arguments all are. A
factory without `device=`, `.cpu()` and `.to("cpu")` make CPU tensors. Every operation that gets
GPU and CPU tensors together (a 0-dim CPU tensor aside, which torch accepts) is recorded: on a
real GPU it fails, or, indexing a GPU tensor with CPU indices, silently copies. So a batch part
the mover forgot, a layer reading the DGL block's own CPU index arrays, or a tensor made on the
CPU inside a layer shows up as a recorded operation, and a step that falls back to the CPU
altogether gives a loss that is not on the device.

Backward and the optimiser are not traced: autograd puts each gradient on its input's device,
and Adam updates each parameter where it is.
"""
from __future__ import annotations

import dgl
import pytest
import torch
from omegaconf import OmegaConf
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from degnn.models import GNN, build_link_model
from degnn.pipelines.lamp.graph import LocalGraph
from degnn.pipelines.lamp.pipeline import LampNet
from degnn.runtime.device import DeviceMover
from degnn.tasks.link import LinkTask
from degnn.tasks.node import NodeTask

FAKE = torch.device("cuda")
GETTERS = {torch.Tensor.device.__get__, torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__,
           torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.__len__,
           torch.Tensor.requires_grad.__get__, torch.Tensor.is_sparse.__get__, torch.Tensor.layout.__get__}


def _device_arg(args, kwargs):
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)):
            try:
                return torch.device(a)
            except RuntimeError:
                pass
    return None


class FakeGPU(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.mixed = []  # (operation, shapes of its CPU tensor arguments)

    @staticmethod
    def mark(*tensors):
        for t in tensors:
            t._on_gpu = True
        return tensors

    @staticmethod
    def on(t) -> bool:
        return getattr(t, "_on_gpu", False)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in GETTERS:
            return func(*args, **kwargs)
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            dev = FAKE if func is torch.Tensor.cuda else torch.device("cpu") if func is torch.Tensor.cpu \
                else _device_arg(args, kwargs)
            if dev is not None:  # a copy between host and device
                out = args[0].clone()
                if dev.type == "cuda":
                    self.mark(out)
                return out
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        out = func(*args, **kwargs)
        gpu = [t for t in tensors if self.on(t)]
        cpu = [t for t in tensors if not self.on(t) and t.dim() > 0]
        if gpu and cpu:
            self.mixed.append((getattr(func, "__name__", str(func)), [tuple(t.shape) for t in cpu]))
        elif (tensors and not cpu and gpu) or (not tensors and kwargs.get("device") is not None):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.mark(t)
        return out


def _modes_see_indexing() -> bool:
    """Whether this torch hands Tensor.__getitem__ to a function mode (torch 2.1 and 2.2 do not: a
    tensor indexed by another then escapes FakeGPU, and its check reports it as a CPU tensor)."""
    seen = []

    class Probe(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Probe():
        torch.arange(3)[torch.tensor([0])]
    return torch.Tensor.__getitem__ in seen


needs_indexing_modes = pytest.mark.skipif(
    not _modes_see_indexing(), reason=f"torch {torch.__version__} does not hand Tensor.__getitem__ to "
                                      "function modes: the faked GPU cannot follow indexed tensors")


def _cfg(task):
    return OmegaConf.create({"dataset": {"name": "t", "kind": "synthetic", "task": task},
                             "model": {"name": "sage", "layers": 2, "hidden": 8, "fanouts": [3, 3],
                                       "dropout": 0.5, "heads": 2, "backend": "torch"}})


def _graph():
    torch.manual_seed(0)
    g = dgl.remove_self_loop(dgl.to_bidirected(dgl.rand_graph(40, 160)))
    g.ndata["feat"] = torch.randn(40, 5)
    g.ndata["label"] = torch.randint(0, 3, (40,))
    return g


def _model(kind, task):
    cfg = _cfg(task).model
    cfg.name = kind
    torch.manual_seed(0)
    return GNN(kind, 5, 8, 3, 2, 0.5, 2, "torch") if task == "node" else build_link_model(cfg, 5)


@needs_indexing_modes
@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("task_name", ["node", "link"])
def test_a_local_step_computes_on_the_device_only(kind, task_name):
    """A TMA/distdgl step (Task.batch_loss through the pipeline's DeviceMover) of every model and
    task, backend torch, with train.device a (faked) GPU."""
    g = _graph()
    task = NodeTask(_cfg("node")) if task_name == "node" else LinkTask(_cfg("link"))
    model = _model(kind, task_name)
    batch = next(iter(task.local_loader(g, torch.arange(12), 6)))
    mover = DeviceMover(FAKE, "torch")
    with FakeGPU() as gpu:
        gpu.mark(*model.parameters())
        loss = task.batch_loss(model, batch, g.ndata["feat"], g.ndata["label"], mover)
    assert gpu.mixed == [], f"CPU tensors in the step: {gpu.mixed[:5]}"
    assert FakeGPU.on(loss), "the loss was computed on the CPU"
    # the batch's structure and inputs were copied once each (x, y or the pairs, and the blocks)
    assert mover.tensors > 0 and mover.bytes >= g.ndata["feat"][batch[0]].numel() * 4


@needs_indexing_modes
@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_a_lamp_step_computes_on_the_device_only(kind):
    """LAMP's trainer step: the locality-aware blocks, the inner rows and the leaves (halo rows,
    histories, the owners' answers) moved by the mover, the loss inside LampNet."""
    src = torch.tensor([1, 2, 0, 3, 4, 6, 7, 5, 8, 2, 1])
    dst = torch.tensor([0, 0, 1, 2, 3, 3, 4, 4, 5, 5, 5])
    part = dgl.graph((src, dst), num_nodes=9)
    part.ndata["inner_node"] = (torch.arange(9) < 6).int()
    part.ndata[dgl.NID] = torch.arange(9) + 10
    lg = LocalGraph.from_partition(part)
    task = NodeTask(_cfg("node"))
    model = _model(kind, "node")
    seeds, target = task.own_batch(torch.tensor([0, 3, 5]), torch.arange(6), torch.tensor([0, 1, 2, 0, 1, 2]))
    cg = lg.build(seeds, [-1, -1])
    x = torch.randn(9, 5)
    answers = torch.randn(len(cg.leaves[1]), 8, requires_grad=True)  # the owners' top rows
    mover = DeviceMover(FAKE, "torch")
    with FakeGPU() as gpu:
        gpu.mark(*model.parameters())
        blocks, xin, leaves, y = mover((cg.blocks, x[cg.inner_src[0]], [x[cg.leaves[0]], answers], target))
        loss, hidden = LampNet(model, task.seed_loss)(blocks, xin, leaves, y)
    assert gpu.mixed == [], f"CPU tensors in the step: {gpu.mixed[:5]}"
    assert FakeGPU.on(loss) and all(FakeGPU.on(h) for h in hidden)
    loss.backward()
    assert answers.grad is not None  # the answers' gradient comes back through the copy


def test_the_check_sees_a_forgotten_structure_and_a_cpu_model():
    """The check itself: blocks left as DGL graphs (the layer then reads their CPU index arrays)
    and a model whose parameters stayed on the CPU are both recorded."""
    g = _graph()
    task = NodeTask(_cfg("node"))
    model = _model("sage", "node")
    batch = next(iter(task.local_loader(g, torch.arange(12), 6)))
    mover = DeviceMover(FAKE, "torch")
    with FakeGPU() as gpu:
        gpu.mark(*model.parameters())
        x, y = mover(task.inputs(batch, g.ndata["feat"], g.ndata["label"]))  # the blocks are not moved
        task.loss(model, batch, x, y)
    assert gpu.mixed, "blocks left on the CPU were not seen"
    with FakeGPU() as gpu:  # parameters not marked: a model left on the CPU
        task.batch_loss(_model("sage", "node"), batch, g.ndata["feat"], g.ndata["label"], DeviceMover(FAKE, "torch"))
    assert gpu.mixed, "a model left on the CPU was not seen"
