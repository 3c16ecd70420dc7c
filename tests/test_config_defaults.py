"""Each default is written once, or, where it must be written twice, the two copies agree.

A pipeline's keys live in two places: its YAML (`pipeline/<name>.yaml` under degnn.config.CONF_DIR),
which is what Hydra composes (`pipeline` is open at compose time, so only the YAML's keys can be
overridden with `pipeline.KEY=` and shown by `--help`), and its schema (the class's `config_schema`),
merged under it by degnn.pipelines.typed_config. Nothing keeps them equal but this test: every key
of the schema is in the YAML, with the schema's default, and the YAML has no other key.

The dataset, model, partition and cluster groups are typed by degnn/config.py at compose time (the
schema's defaults fill what an option leaves out), so their options write only what sets them
apart: a key at the schema's default would be a second copy of it. Datasets are the exception:
a dataset file states the graph's shape (nodes, classes, feature width, degree) in full, like the
real graph it stands for, so it may name a value that happens to be the default.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from degnn import config as C


def conf_dir() -> Path:
    return Path(C.CONF_DIR() if callable(C.CONF_DIR) else C.CONF_DIR)


def schema_defaults(schema) -> dict:
    """Every field's default as plain data (MISSING as '???')."""
    return OmegaConf.to_container(OmegaConf.structured(schema))


def option_keys(path: Path) -> dict:
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    data.pop("defaults", None)
    return data


def pipeline_files():
    files = sorted((conf_dir() / "pipeline").glob("*.yaml"))
    assert files, f"no pipeline YAML under {conf_dir()}"
    return files


def pipeline_differences(path: Path):
    """What differs between one pipeline YAML and its class's schema, one line each."""
    yaml = option_keys(path)
    schema = get_class(yaml["_target_"]).config_schema
    want = schema_defaults(schema)
    base = schema_defaults(C.PipelineConfig)
    out = []
    for key, value in yaml.items():
        if key not in want:
            out.append(f"{path.name}: {key}: {value!r} is not a key of {schema.__name__}")
        elif key in base and want[key] == base[key]:
            continue  # a common key the schema leaves at PipelineConfig's (_target_, services): the YAML's alone
        elif value != want[key]:
            out.append(f"{path.name}: {key}: {value!r} here, {want[key]!r} in {schema.__name__}")
    for key in want:
        # the pipeline's own keys must be in the YAML (or `pipeline.KEY=` cannot set them); the
        # common ones (variant, services) only where the pipeline uses them
        if key not in yaml and key not in base:
            out.append(f"{path.name}: {key} is missing (the default of {schema.__name__}: {want[key]!r})")
    return out


@pytest.mark.parametrize("path", pipeline_files(), ids=lambda p: p.stem)
def test_pipeline_yaml_has_its_schema_defaults(path):
    bad = pipeline_differences(path)
    assert not bad, "the YAML and the schema's defaults differ; make them equal:\n" + "\n".join(bad)


GROUPS = {"model": C.ModelConfig, "partition": C.PartitionConfig, "cluster": C.ClusterConfig}


def repeated_defaults(group: str, schema) -> list:
    want = schema_defaults(schema)
    out = []
    for path in sorted((conf_dir() / group).glob("*.yaml")):
        for key, value in option_keys(path).items():
            if key not in want:
                out.append(f"{group}/{path.name}: {key} is not a key of {schema.__name__}")
            elif value == want[key]:
                out.append(f"{group}/{path.name}: {key}: {value!r} repeats {schema.__name__}'s default")
    return out


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_group_options_do_not_repeat_schema_defaults(group):
    bad = repeated_defaults(group, GROUPS[group])
    assert not bad, "remove the key from the YAML (the schema's default applies):\n" + "\n".join(bad)


def test_dataset_options_have_only_schema_keys():
    keys = set(schema_defaults(C.DatasetConfig))
    bad = [f"dataset/{p.name}: {k}" for p in sorted((conf_dir() / "dataset").glob("*.yaml"))
           for k in option_keys(p) if k not in keys]
    assert not bad, bad


def test_the_checks_catch_a_difference(tmp_path, monkeypatch):
    lamp = option_keys(conf_dir() / "pipeline" / "lamp.yaml")
    changed = tmp_path / "lamp.yaml"
    for edit, expect in [({"bits": lamp["bits"] * 2}, "bits:"), ({"bitz": 8}, "not a key"),
                         ({"fusion": None}, "fusion:")]:
        OmegaConf.save(OmegaConf.create({**lamp, **edit}), changed)
        assert any(expect in line for line in pipeline_differences(changed)), edit
    OmegaConf.save(OmegaConf.create({k: v for k, v in lamp.items() if k != "halo_bits"}), changed)
    assert any("halo_bits is missing" in line for line in pipeline_differences(changed))
    (tmp_path / "model").mkdir()
    OmegaConf.save(OmegaConf.create({"name": "x", "hidden": C.ModelConfig.hidden}), tmp_path / "model" / "x.yaml")
    monkeypatch.setattr(C, "CONF_DIR", str(tmp_path))
    assert repeated_defaults("model", C.ModelConfig) == [
        f"model/x.yaml: hidden: {C.ModelConfig.hidden} repeats ModelConfig's default"]
