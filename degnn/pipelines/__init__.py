"""Training pipelines behind one contract (base.Pipeline), trained by one loop (loop.py).

A pipeline is found through its config, never by name in code: `conf/pipeline/<name>.yaml` (or
the same file in a folder on Hydra's search path, `hydra.searchpath=[file://DIR]`) sets
`_target_` to the pipeline class. The launcher and the process entry read what the class
declares (tasks, fault policy, trainers per machine, its preflight).
"""
from __future__ import annotations

from typing import Dict, List

TASK_NAMES = {"node": "node classification", "link": "link prediction"}


def pipeline_class(cfg):
    """The class `cfg.pipeline._target_` names (ValueError, one line, when it is not importable)."""
    from hydra.utils import get_class

    target = cfg.pipeline.get("_target_")
    if not target:
        raise ValueError(f"pipeline={cfg.pipeline.name}: its config sets no _target_ (the pipeline class, "
                         f"e.g. _target_: package.module.MyPipeline)")
    try:
        return get_class(target)
    except Exception as e:  # noqa: BLE001 -- Hydra wraps the import error
        cause = e.__cause__ or e
        raise ValueError(f"pipeline={cfg.pipeline.name}: _target_={target} cannot be imported "
                         f"({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})") from None


def typed_config(cfg):
    """Type `cfg.pipeline` by its class's schema (Pipeline.config_schema), in place, and return the
    class; ValueError (one line) naming an unknown key or a value of the wrong type."""
    import dataclasses

    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import ConfigKeyError, ValidationError

    cls = pipeline_class(cfg)
    schema = cls.config_schema
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), cfg.pipeline)
    except ConfigKeyError as e:
        keys = ", ".join(f.name for f in dataclasses.fields(schema) if not f.name.startswith("_"))
        raise ValueError(f"pipeline.{e.key}: pipeline={cfg.pipeline.name} has no such key; remove it or "
                         f"fix its spelling (its keys: {keys})") from None
    except ValidationError as e:
        raise ValueError(f"pipeline.{e.key}={e.value!r}: pipeline={cfg.pipeline.name} expects "
                         f"{_type_name(schema, e.key)} there") from None
    with open_dict(cfg):
        cfg.pipeline = typed
    return cls


def _type_name(schema, key) -> str:
    import dataclasses

    for f in dataclasses.fields(schema):
        if f.name == key:
            return str(f.type).replace("typing.", "")
    return "another type"


def known_pipelines(search_dirs: List[str]) -> Dict[str, str]:
    """name -> _target_ of every pipeline config in `search_dirs` (their pipeline/*.yaml)."""
    from pathlib import Path

    from omegaconf import OmegaConf

    out: Dict[str, str] = {}
    for d in search_dirs:
        for f in sorted(Path(d, "pipeline").glob("*.yaml")):
            target = OmegaConf.load(f).get("_target_")
            if target:
                out.setdefault(f.stem, str(target))
    return out


def check_task(cls, cfg, search_dirs: List[str]) -> None:
    """ValueError (one line) when the pipeline does not train the dataset's task; it names the
    pipelines that do (from what each declares)."""
    from hydra.utils import get_class

    task = cfg.dataset.task
    if task in cls.tasks:
        return
    what = " and ".join(TASK_NAMES.get(t, t) for t in cls.tasks)
    others = [f"pipeline={name}" for name, target in known_pipelines(search_dirs).items()
              if task in getattr(get_class(target), "tasks", ())]
    fix = f"use {' or '.join(others)}" if others else "no pipeline here trains it"
    raise ValueError(f"pipeline={cls.name} trains {what} only; dataset {cfg.dataset.name} is a "
                     f"{TASK_NAMES.get(task, task)} task (dataset.task={task}): {fix}")


def check_trainers(cls, cfg) -> None:
    """ValueError when the cluster runs more trainers a machine than the pipeline supports."""
    most = cls.max_trainers_per_machine
    tpm = cfg.cluster.trainers_per_machine
    if most is not None and tpm > most:
        raise ValueError(f"pipeline={cls.name} runs at most {most} trainer(s) a machine: set "
                         f"cluster.trainers_per_machine={most}")
    if cfg.train.batches_per_epoch and not cls.shortens_epochs:
        raise ValueError(f"train.batches_per_epoch={cfg.train.batches_per_epoch}: pipeline={cls.name} "
                         f"does not shorten its epochs; remove it")
