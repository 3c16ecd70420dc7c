"""What a finished run directory gives inference: its config, its best model, its partitions.

`run_config(run_dir, overrides)`: the run's config.yaml (what rank 0 trained with, resolved) laid
over this degnn version's schema, composed with the run's own config choices (.hydra/hydra.yaml,
degnn/runtime/run_config.py);
a key this version does not know, or a value of the wrong type, means another version wrote it.
The command and every process of the inference cluster call it alike, so they agree.
Each failure is one line (InferError) naming the file and the fix.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

from degnn.runtime.checkpoint import BEST_MODEL, CONFIG_FILE
from degnn.runtime.run_config import GROUPS, saved_choices

# what `python -m degnn.infer RUN_DIR KEY=VALUE` may change: where and how the cluster runs and
# where the data lies now, never what was trained
OVERRIDABLE = ("cluster.", "train.eval_batch_size", "train.device", "dataset.root", "partition.root",
               "partition.path")
# new (partition) node id -> original id, beside the partition JSON (partitioners/writer.py)
ORIG_NIDS = "orig_nids.pt"


class InferError(RuntimeError):
    """A run directory inference cannot use; the message is one line with the fix."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def check_overrides(overrides: Sequence[str]) -> None:
    for o in overrides:
        key = o.split("=", 1)[0]
        if "=" not in o or not any(key == k or (k.endswith(".") and key.startswith(k)) for k in OVERRIDABLE):
            raise InferError(f"{o}: inference takes KEY=VALUE for cluster.*, train.eval_batch_size, "
                             f"train.device, dataset.root, partition.root and partition.path only (the rest is the "
                             f"run's own config)")


def _choices(run_dir: Path, saved) -> tuple:
    """(the run's config group options as overrides, its hydra.searchpath overrides)."""
    choices, searchpath = saved_choices(run_dir, saved)
    return [f"{g}={choices[g]}" for g in GROUPS], searchpath


def run_config(run_dir, overrides: Sequence[str] = ()):
    """The run's config as this version's typed config, with `overrides` (check_overrides) applied."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from degnn.entry import compose_config

    run_dir = Path(run_dir)
    cfg_file = run_dir / CONFIG_FILE
    if not run_dir.is_dir():
        raise InferError(f"{run_dir}: no such directory; pass the run directory of a finished run "
                         f"(its hydra.run.dir)")
    if not cfg_file.is_file():
        raise InferError(f"{run_dir} holds no {CONFIG_FILE}: not the directory of a degnn run that "
                         f"started training; pass the run's hydra.run.dir")
    other = (f"{cfg_file} was written by another degnn version ({{}}); run degnn.infer with the "
             f"version that trained it, or train again with this one")
    try:
        saved = OmegaConf.load(cfg_file)
        groups, searchpath = _choices(run_dir, saved)
    except (OmegaConfBaseException, AttributeError, ValueError) as e:
        raise InferError(other.format(_first_line(e))) from None
    try:
        base = compose_config(groups + searchpath)
    except Exception as e:  # noqa: BLE001 - Hydra's own message: a group option this version lacks
        raise InferError(other.format(_first_line(e))) from None
    try:
        cfg = OmegaConf.merge(base, saved)
    except OmegaConfBaseException as e:
        raise InferError(other.format(_first_line(e))) from None
    check_code(cfg, run_dir, searchpath)
    check_overrides(overrides)
    python = cfg.cluster.get("python")
    if python and not any(o.split("=", 1)[0] == "cluster.python" for o in overrides):
        raise InferError(f"{run_dir}/{CONFIG_FILE} sets cluster.python={python}, the program every "
                         f"host would run: degnn.infer runs no program a run directory names; pass "
                         f"cluster.python={python} to degnn.infer if it is yours")
    if overrides:
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        except OmegaConfBaseException as e:
            raise InferError(f"{_first_line(e)}; fix the KEY=VALUE given to degnn.infer") from None
    return cfg


def _searchpath_dirs(searchpath: Sequence[str]) -> List[str]:
    """The folders `hydra.searchpath=[file://DIR,...]` overrides name."""
    import re

    return [m for o in searchpath for m in re.findall(r"file://([^,\]'\"]+)", str(o))]


def check_code(cfg, run_dir: Path, searchpath: Sequence[str]) -> None:
    """A run directory is data, not code: config.yaml names the pipeline class (pipeline._target_)
    and the modules of its RPC services (pipeline.services), which every process imports. Only
    degnn's own (modules under `degnn.`) and what a pipeline config on the run's Hydra search path
    declares (a pipeline of one's own, as the launcher found it) are imported; anything else (a
    run directory from elsewhere naming subprocess.Popen) is refused before anything starts."""
    from omegaconf import OmegaConf

    from degnn.config import CONF_DIR

    dirs = _searchpath_dirs(searchpath)
    inside = [d for d in dirs if Path(d).resolve().is_relative_to(run_dir.resolve())]
    if inside:
        raise InferError(f"{run_dir}/.hydra/hydra.yaml puts {inside[0]}, inside the run directory, on "
                         f"Hydra's search path: a run directory holds no code; put the pipeline's "
                         f"config folder elsewhere and train again")
    targets, services = set(), set()
    for d in [CONF_DIR, *dirs]:
        for f in sorted(Path(d, "pipeline").glob("*.yaml")):
            try:
                declared = OmegaConf.load(f)
            except Exception:  # noqa: BLE001 - not a config: declares nothing
                continue
            if declared.get("_target_"):
                targets.add(str(declared._target_))
            services.update(str(m) for m in (declared.get("services") or []))

    def ours(name: str) -> bool:
        return name.startswith("degnn.")

    target = str(cfg.pipeline.get("_target_") or "")
    if not (ours(target) or target in targets):
        raise InferError(f"{run_dir}/{CONFIG_FILE} names pipeline._target_={target}, which is neither "
                         f"degnn's nor a pipeline its Hydra search path declares: degnn.infer imports "
                         f"no other code from a run directory; fix pipeline._target_ there")
    for module in cfg.pipeline.get("services") or []:
        if not (ours(str(module)) or str(module) in services):
            raise InferError(f"{run_dir}/{CONFIG_FILE} names the service module {module} "
                             f"(pipeline.services), which is neither degnn's nor one a pipeline on "
                             f"its Hydra search path declares: degnn.infer imports no other code "
                             f"from a run directory; fix pipeline.services there")


def load_best_model(run_dir) -> dict:
    """best_model.pt of `run_dir` (read with weights_only=True: tensors and numbers only)."""
    import pickle

    import torch

    path = Path(run_dir) / BEST_MODEL
    if not path.is_file():
        raise InferError(f"{run_dir} holds no {BEST_MODEL}: the run never finished an evaluation "
                         f"(failed or stopped before its first one); train it again")
    try:
        best = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise InferError(f"{path} is damaged or not written by this degnn version "
                         f"({type(e).__name__}: {_first_line(e)[:100]}); train again") from None
    if not isinstance(best, dict) or "model" not in best:
        raise InferError(f"{path} holds no model state (not a degnn best model); train again")
    return best


def run_partitions(cfg, run_dir) -> Path:
    """The partition JSON the run trained on: its `partition.path` (a partition made elsewhere,
    checked as the launcher checks it), else the cached partitions of its dataset and partition
    config (degnn.partition_cache.planned_partitions); either must still be there, with the original
    node ids (orig_nids.pt beside the JSON: new id -> original id)."""
    from degnn.partition_cache import planned_partitions
    from partitioners import PartitionError, existing_partition
    from degnn.runtime.cluster import machines_of

    if cfg.partition.get("path"):
        try:
            part_config = existing_partition(cfg.partition.path, len(machines_of(cfg.cluster)))
        except PartitionError as e:
            raise InferError(f"the partition {run_dir} trained on: {e}") from None
        ids = part_config.parent / ORIG_NIDS
        if not ids.is_file():
            raise InferError(
                f"{ids} is missing: a partition made elsewhere renumbers the nodes and degnn cannot map "
                f"them back; save partition_graph(..., return_mapping=True)'s first tensor there "
                f"(torch.save(orig_nids, '{ids}'))")
        return part_config
    try:
        part_config, built = planned_partitions(cfg.dataset, cfg.partition)
    except Exception as e:  # noqa: BLE001 - the partitioner's own message
        raise InferError(f"the partitions of {run_dir}: {_first_line(e)}") from None
    if not built:
        raise InferError(f"the partitions {run_dir} trained on are missing ({Path(part_config).parent} "
                         f"is gone or incomplete, or the dataset changed since): train the run again "
                         f"(python -m degnn.launch with its .hydra/overrides.yaml) to rebuild them")
    ids = Path(part_config).parent / ORIG_NIDS
    if not ids.is_file():
        raise InferError(f"{ids} is missing: the partitions hold no original node ids; rebuild "
                         f"them with degnn's partitioner (train the run again)")
    return Path(part_config)
