"""A run directory's own config, and that config under a command's overrides (`resume=DIR`).

A run directory holds `config.yaml` (what rank 0 ran with, resolved; the launcher's own where no
trainer started) and, started by degnn.launch, Hydra's `.hydra/hydra.yaml` with the config group
options it chose. `saved_choices` reads those options (degnn.infer composes a run's config from
them too).

`resume=DIR` continues that run with its own config: the launcher puts the run's group options on
the command line where the command gives none (`resume_group_overrides`, before Hydra composes),
and the launcher and every process lay the run's saved values over the composed config, except
the keys the command gives (`resumed_config`): those win. A given key or group that would change
what the checkpoint holds (the model, the data and its partition, the number of trainers) is
refused in one line naming both values (`resume_conflict`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .checkpoint import CONFIG_FILE

GROUPS = ("dataset", "model", "pipeline", "partition", "cluster")
# what a resumed run cannot change: its checkpoint's model, data, partition and trainer count
FIXED_GROUPS = ("dataset", "model", "pipeline", "partition")
FIXED_KEYS = ("dataset.", "model.", "pipeline.name", "pipeline.variant", "partition.",
              "cluster.machines", "cluster.trainers_per_machine")
# ... except where the data and the partitions lie, and how the cache is checked
FREE_KEYS = ("dataset.root", "partition.root", "partition.verify")


def load_saved(run_dir):
    """The run's config.yaml as a plain DictConfig, or None where it is missing or unreadable."""
    from omegaconf import OmegaConf

    path = Path(str(run_dir)).expanduser() / CONFIG_FILE
    try:
        saved = OmegaConf.load(path)
    except Exception:  # noqa: BLE001 - missing or damaged: resume's own checks say so
        return None
    return saved if hasattr(saved, "keys") else None


def saved_choices(run_dir, saved) -> Tuple[Dict[str, str], List[str]]:
    """({group: the run's option}, the run's hydra.searchpath overrides)."""
    from omegaconf import OmegaConf

    names = {"dataset": saved.dataset.name, "model": saved.model.name, "pipeline": saved.pipeline.name,
             "partition": saved.partition.method, "cluster": saved.cluster.kind}
    searchpath: List[str] = []
    hydra_file = Path(str(run_dir)).expanduser() / ".hydra" / "hydra.yaml"
    if hydra_file.is_file():  # started by degnn.launch (a run of DGL's launch.py has none)
        h = OmegaConf.load(hydra_file).hydra
        chosen = h.runtime.choices
        # the partition method is the trained one (a pipeline's variant may have picked it)
        names.update({g: chosen[g] for g in GROUPS if g != "partition" and chosen.get(g)})
        searchpath = [o for o in h.overrides.hydra if str(o).startswith("hydra.searchpath=")]
    return {g: str(names[g]) for g in GROUPS}, searchpath


def _given(overrides: Sequence[str]) -> Dict[str, str]:
    """{key: value as written} of KEY=VALUE overrides (the last of a key; `+`/`~` dropped)."""
    return {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] for o in overrides if "=" in o}


def _leaves(node, prefix: str = "") -> Dict[str, object]:
    out = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if hasattr(v, "keys"):
            out.update(_leaves(v, key + "."))
        else:
            out[key] = v
    return out


def resume_group_overrides(resume, overrides: Sequence[str]) -> List[str]:
    """`GROUP=OPTION` of the resumed run for each group the overrides do not choose ([] where the
    run directory has no readable config.yaml: resume's own checks then name the problem)."""
    saved = load_saved(resume)
    if saved is None:
        return []
    try:
        choices, _ = saved_choices(resume, saved)
    except Exception:  # noqa: BLE001 - another version's file: resume's own checks say so
        return []
    given = _given(overrides)
    return [f"{g}={choices[g]}" for g in GROUPS if g not in given]


def resumed_config(cfg, overrides: Sequence[str]):
    """`cfg` (composed with `overrides`) with the resumed run's saved values for every key the
    overrides do not give (nor the group of, where they choose another option); `cfg` itself
    without resume= or a readable config.yaml."""
    from omegaconf import OmegaConf, open_dict

    resume = cfg.get("resume")
    saved = load_saved(resume) if resume else None
    if saved is None:
        return cfg
    choices, _ = saved_choices(resume, saved)
    given = _given(overrides)
    switched = {g for g in GROUPS if g in given and given[g] != choices[g]}
    # another cluster option (cluster=netns for a local run) starts from its own defaults, but
    # keeps the run's machine and trainer counts
    keep = {k: v for k, v in _leaves(saved).items()
            if k not in given and (k.split(".")[0] not in switched or _fixed(k)) and k != "resume"}
    layer = OmegaConf.create()
    for k, v in keep.items():
        OmegaConf.update(layer, k, v, force_add=True)
    # the saved config holds the pipeline's typed keys (degnn.pipelines.typed_config), which the
    # composed one gets only later: open for the merge; every key is checked against the schemas
    # after it (preflight.check_config), as for any run
    struct = OmegaConf.is_struct(cfg)
    with open_dict(cfg):
        merged = OmegaConf.merge(cfg, layer)
    OmegaConf.set_struct(merged, struct)
    return merged


def _fixed(key: str) -> bool:
    return key not in FREE_KEYS and any(key == k or (k.endswith(".") and key.startswith(k))
                                        for k in FIXED_KEYS)


def resume_conflict(cfg, overrides: Sequence[str]) -> Optional[str]:
    """The one line refusing an override that changes what the resumed run's checkpoint holds
    (both values named), or None."""
    from omegaconf import OmegaConf

    resume = cfg.get("resume")
    saved = load_saved(resume) if resume else None
    if saved is None:
        return None
    choices, _ = saved_choices(resume, saved)
    source = Path(str(resume)) / CONFIG_FILE
    for key, value in _given(overrides).items():
        if key in FIXED_GROUPS:
            was, now = choices[key], value
        elif _fixed(key):
            was = _plain(OmegaConf.select(saved, key, default=None))
            now = _plain(OmegaConf.select(cfg, key, default=None))
        else:
            continue
        if was != now:
            return (f"resume={resume}: that run was trained with {key}={_show(was)} ({source}), this "
                    f"command gives {key}={_show(now)}; resume without {key}= (the run's own value is "
                    f"used), or start a new run (without resume=)")
    return None


def _plain(value):
    from omegaconf import Container, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value


def _show(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(map(_show, value)) + "]"
    return str(value)
