"""The README a newcomer reads: short, its links resolve, and its quick commands run as written."""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def bash_commands(text: str):
    """Every command of the ```bash blocks, continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_readme_is_short():
    assert len(README.read_text().splitlines()) < 200


@pytest.mark.parametrize("doc", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    missing = [target for target in LINK.findall(doc.read_text())
               if "://" not in target and not (doc.parent / target).exists()]
    assert not missing, f"{doc.name} links to {missing}"


QUICK = ("--help", "cluster.dry_run=true")


def test_the_quick_commands_run_as_written(tmp_path):
    """The help and the dry run, exactly as the README writes them (a dry run builds nothing)."""
    commands = [c for c in bash_commands(README.read_text()) if any(q in c for q in QUICK)]
    assert len(commands) == len(QUICK), commands
    for command in commands:
        argv = shlex.split(command)
        if "cluster.dry_run=true" in command:
            argv.append(f"hydra.run.dir={tmp_path / 'dry'}")  # not under the checkout's runs/
        p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (command, p.stdout[-2000:], p.stderr[-2000:])
        assert p.stdout.strip(), command


def test_the_config_reference_is_current():
    """docs/config.md is what `python -m degnn.reference` writes from the schemas (regenerate it
    with `python -m degnn.reference > docs/config.md` after changing a key)."""
    from degnn.reference import reference

    assert (REPO / "docs" / "config.md").read_text() == reference()
