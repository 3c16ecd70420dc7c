"""A pipeline is its folder plus a config file: tests/plugins/localsgd (plain local SGD with model
averaging) lives only under tests/, and the launcher finds it through Hydra's search path and
trains it on a real 2-machine cluster, with no file of degnn naming it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from netns_support import needs_netns
from timing import budget

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "tests" / "plugins"


def test_nothing_outside_the_plugin_names_it():
    """No code or config of degnn names it (the README shows how to run it)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    naming = [f for f in tracked if not f.startswith("tests/") and not f.endswith(".md")
              and "localsgd" in (REPO / f).read_text(errors="ignore")]
    assert naming == []


@needs_netns
def test_a_pipeline_of_ones_own_trains_on_two_machines(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(PLUGINS)}
    r = subprocess.run([sys.executable, "-m", "degnn.launch", f"hydra.searchpath=[file://{PLUGINS / 'conf'}]",
                        "pipeline=localsgd", "cluster=netns", "cluster.machines=2", "dataset=synthetic-tiny",
                        "train.epochs=2", "train.lr=0.01", "train.batch_size=128", f"hydra.run.dir={run_dir}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=budget(150))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["pipeline"] == "localsgd" and s["status"] == "ok" and s["epochs"] == 2 and s["trainers"] == 2
    # averaged before the last evaluation: both trainers hold the same model; and it learned
    # (8 classes: chance is 0.125)
    assert s["params_agree"] is True and s["test"] > 0.125 + 0.2, s
    assert s["app_bytes_by_category"]["features"] > 0 and s["time_per_batch_s"]["compute"] > 0
    assert "result: pipeline=localsgd" in r.stdout
