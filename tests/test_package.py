"""degnn as a package: the wheel holds degnn, the partitioners and the Hydra configs of conf/ (as
degnn/conf), not the benchmark harness; installed into
a fresh virtual environment outside the checkout, its console scripts answer --help, sweep, and
train a 2-machine netns job from an empty directory, writing nothing into the installed package."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from netns_support import REASON
from timing import budget

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
SCRIPTS = {"degnn-launch": "degnn.", "degnn-partition": "partitioners.", "degnn-demo": "degnn.", "degnn-infer": "degnn."}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # built from a copy: setuptools writes build/ and degnn.egg-info/ next to pyproject.toml
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    for name in ("degnn", "partitioners", "conf", "benchmarks"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(out), str(src)], capture_output=True, text=True,
                       timeout=budget(120))
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("degnn-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A virtual environment outside the checkout with the wheel installed; its dependencies
    (torch, DGL, ...) are this interpreter's site-packages, listed in a .pth file. A .pth line only
    adds a folder to sys.path, it runs none of the .pth files inside it: the editable install's
    finder there (which maps `degnn` to the checkout) stays off."""
    root = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=budget(60))
    py = root / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                        "--no-index", str(wheel)], capture_output=True, text=True, timeout=budget(120))
    assert r.returncode == 0, r.stdout + r.stderr
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if Path(p).name == "site-packages" and Path(p).is_dir()]
    assert deps, sys.path
    Path(site, "degnn_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    return root


def clean_env() -> dict:
    """The environment of a user's shell: no PYTHONPATH, none of degnn's own variables (data and
    partitions then go under the working directory)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DEGNN_")}
    return {**env, "DEGNN_PROGRESS": "0"}


def run(cmd, cwd, timeout=60):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=budget(timeout))


def package_dir(venv: Path) -> Path:
    (pkg,) = venv.glob("lib/python*/site-packages/degnn")
    return pkg


def test_wheel_has_every_config_and_no_other_top_level_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        meta = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert {n.split("/")[0] for n in names} == {"degnn", "partitioners", wheel.name.split("-py3")[0] + ".dist-info"}
    configs = {"degnn/" + str(p.relative_to(REPO)) for p in CONF.rglob("*.yaml")}
    assert "degnn/conf/config.yaml" in configs and configs <= names, sorted(configs - names)
    groups = {p.parent.name for p in CONF.glob("*/*.yaml")}
    assert groups == {"dataset", "model", "pipeline", "partition", "cluster"}
    assert not [n for n in names if "bench" in n]  # the harness stays in the checkout
    for script, package in SCRIPTS.items():
        assert f"{script} = {package}" in entry_points
    assert "degnn-bench" not in entry_points
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in meta
    requires = [l.split(": ", 1)[1] for l in meta.splitlines() if l.startswith("Requires-Dist: ")]
    plain = [r for r in requires if "extra ==" not in r]
    assert not [r for r in plain if r.split(";")[0].startswith(("matplotlib", "psutil", "scipy", "tensorboard"))]
    assert any(r.startswith("matplotlib") and 'extra == "bench"' in r for r in requires)


def test_installed_package_is_the_wheel_not_the_checkout(venv, tmp_path):
    r = run([venv / "bin" / "python", "-c", "import sys, degnn, degnn.config as c; "
             "print(degnn.__file__); print(c.CONF_DIR); print(*sys.path, sep='\\n')"], tmp_path)
    assert r.returncode == 0, r.stderr
    file, conf, *path = r.stdout.splitlines()
    assert Path(file).is_relative_to(venv) and Path(conf).is_relative_to(venv), r.stdout
    assert REPO not in [(tmp_path / p).resolve() for p in path], path  # "" is its working directory


def help_groups(text: str) -> dict:
    """The `== Groups (GROUP=OPTION) ==` block of a --help: {group: {options}}."""
    block = text.split("== Groups (GROUP=OPTION) ==\n", 1)[1].split("\n\n", 1)[0]
    listed, group = {}, None
    for line in block.splitlines():
        if not line.startswith(" "):
            group, line = line.split(":", 1)
        listed.setdefault(group, set()).update(o.strip() for o in line.split(",") if o.strip())
    return listed


def options(*groups) -> dict:
    return {g: {f.stem for f in (CONF / g).glob("*.yaml")} for g in groups}


def test_console_scripts_answer_help_with_their_own_groups(venv, tmp_path):
    launch_groups = [d.name for d in CONF.iterdir() if d.is_dir()]
    wanted = {"degnn-launch": options(*launch_groups), "degnn-partition": options("dataset", "partition")}
    for script in SCRIPTS:
        r = run([venv / "bin" / script, "--help"], tmp_path)
        assert r.returncode == 0, (script, r.stderr)
        assert "powered by Hydra" not in r.stdout and f"usage: {script}" in r.stdout, (script, r.stdout)
        if script in wanted:
            assert help_groups(r.stdout) == wanted[script], script
    assert not list(tmp_path.iterdir())  # --help ran nothing, wrote nothing


def test_a_sweep_through_the_console_script_is_one_job_per_value(venv, tmp_path):
    r = run([venv / "bin" / "degnn-launch", "-m", "cluster=netns", "cluster.machines=2", "cluster.dry_run=true",
             "model.hidden=16,32", "hydra.sweep.dir=sweep"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("machine 1 (10.77.0.2):") == 2, r.stdout
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1"]


def files_of(pkg: Path) -> dict:
    # bytecode caches left out: the interpreter may write them next to the modules it imports
    return {str(p.relative_to(pkg)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in pkg.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_two_machine_netns_job_from_an_empty_directory(venv, tmp_path):
    pkg = package_dir(venv)
    before = files_of(pkg)
    r = run([venv / "bin" / "degnn-launch", "dataset=synthetic-tiny", "cluster=netns", "cluster.machines=2",
             "train.epochs=1", "hydra.run.dir=run"], tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "netns cluster of 2 machines up" in r.stderr
    assert "status=ok" in r.stdout.splitlines()[-1], r.stdout[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["machines"] == 2 and summary["trainers"] == 2
    # the dataset, its partitions and the run under the working directory; nothing in the package
    assert {p.name for p in tmp_path.iterdir()} == {"data", "partitions", "run"}
    assert files_of(pkg) == before


def test_the_wheel_lists_every_package_of_the_tree():
    """pyproject.toml names the wheel's packages one by one (conf/ is mapped to degnn.conf): a new
    folder of degnn/ or partitioners/ must be added there."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for root in ("degnn", "partitioners")
               for p in (REPO / root).rglob("__init__.py")}
    assert listed == on_disk | {"degnn.conf"}


def test_installing_the_wheel_keeps_the_torch_already_there(wheel, tmp_path):
    """A user's environment that already has a supported torch (here this interpreter's, whatever
    version the matrix gives it: docs/install.md) keeps it: pip resolves the wheel's ranges against
    what is installed, with no index to take another torch from (a requirement this torch does not
    meet fails the install instead of quietly replacing it)."""
    import torch

    root = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=budget(60))
    py = root / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if Path(p).name == "site-packages" and Path(p).is_dir()]
    Path(site, "degnn_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    # no pip configuration or PIP_* variables of this machine (find-links, constraints): only the
    # wheel's own requirements decide
    env = {k: v for k, v in clean_env().items() if not k.startswith("PIP_")}
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", str(wheel)],
                       env={**env, "PIP_CONFIG_FILE": os.devnull}, capture_output=True, text=True,
                       timeout=budget(180))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    installed = next(l for l in r.stdout.splitlines() if l.startswith("Successfully installed"))
    assert installed.split()[2:] == [wheel.name.split("-py3")[0]], installed  # degnn-0.1.0, nothing else
    out = run([py, "-c", "import torch, degnn, degnn.compat; print(torch.__version__); "
               "print(torch.__file__); print(degnn.__file__)"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    version, file, degnn_file = out.stdout.splitlines()
    assert (version, file) == (torch.__version__, torch.__file__)
    assert Path(degnn_file).is_relative_to(root)
