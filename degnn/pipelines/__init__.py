"""Training pipelines, one subpackage each, behind one interface (base.Pipeline):
`distdgl` (the baseline), `tma` (RandomTMA / SuperTMA / PSGD-PA / LLCG) and `lamp` (DEGNN's LAMP)."""
from __future__ import annotations

PIPELINES = {"distdgl": "degnn.pipelines.distdgl:DistDGLPipeline",
             "tma": "degnn.pipelines.tma:TMAPipeline",
             "lamp": "degnn.pipelines.lamp.pipeline:LAMPPipeline"}


def get_pipeline(name: str):
    import importlib

    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline '{name}': choose one of {', '.join(sorted(PIPELINES))}")
    module, cls = PIPELINES[name].split(":")
    return getattr(importlib.import_module(module), cls)
