"""Training pipelines, one subpackage each, behind one interface (base.Pipeline):
`distdgl` (the baseline), `lamp` (DEGNN's LAMP) and `tma` (not yet available)."""
from __future__ import annotations

PIPELINES = {"distdgl": "degnn.pipelines.distdgl:DistDGLPipeline",
             "lamp": "degnn.pipelines.lamp.pipeline:LAMPPipeline"}
NOT_YET = {"tma"}


def get_pipeline(name: str):
    import importlib

    if name in NOT_YET:
        raise NotImplementedError(f"pipeline={name} is not yet available in this version of degnn; "
                                  f"use pipeline=distdgl")
    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline '{name}': choose one of {', '.join(sorted(PIPELINES))}")
    module, cls = PIPELINES[name].split(":")
    return getattr(importlib.import_module(module), cls)
