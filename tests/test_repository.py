"""The repository stands alone: no tracked file cites notes that are not in it (the reference
folder, the design card) or names an issue of the tracker by number; the facts it relies on are in
docs/background.md, the one file allowed to say where they came from. (The patterns are spelt in
pieces so that this file passes its own check.)"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {"docs/background.md"}
REFERENCE, CARD, ISSUE = "reference" + "/", "DESIGN" + ".md", "issue" + " "
OUTSIDE = [
    ("cites notes outside the repository", re.compile(r"(?<![\w.-])" + re.escape(REFERENCE))),
    ("cites notes outside the repository", re.compile(r"(?<![\w/.-])" + re.escape(CARD))),
    ("names an issue number", re.compile(r"\b" + ISSUE[:-1] + r"s?\s+#?\d+", re.IGNORECASE)),
]


def tracked_text_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in out.decode().split("\0"):
        path = REPO / name
        if not name or name in ALLOWED or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # images and other binaries
            continue
        yield name, data.decode(errors="replace")


def offences(name: str, text: str):
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in OUTSIDE:
            if pattern.search(line):
                yield f"{name}:{n}: {what}: {line.strip()[:100]}"


def test_no_tracked_file_cites_what_the_repository_lacks():
    bad = [o for name, text in tracked_text_files() for o in offences(name, text)]
    assert not bad, "move the fact into docs/ (or cite the paper) instead:\n" + "\n".join(bad)


def test_the_check_catches_each_kind():
    assert list(offences("x.py", f"# see {REFERENCE}tma.md §2"))
    assert list(offences("x.py", f"({CARD}, pitfalls)"))
    assert list(offences("x.md", f"Two things make it fast ({ISSUE}9)."))
    assert list(offences("x.md", f"({ISSUE[:-1]}s 8 and 9)"))
    assert list(offences("x.md", f"{ISSUE.capitalize()}9's speed bars"))
    assert not list(offences("x.py", '(docs/design.md, "Pitfalls the code relies on")'))
    assert not list(offences("x.py", "the gradient issue is that 3 layers ..."))


def test_background_has_the_sections_others_cite():
    text = (REPO / "docs" / "background.md").read_text()
    heads = set(re.findall(r"^## (.+)$", text, re.MULTILINE))
    assert {"TMA", "LAMP (DEGNN)", "DGL, OGB and Hydra facts"} <= heads
    # every citation of a section of docs/background.md in the tree names a section that exists
    cited = set()
    for name, body in tracked_text_files():
        cited |= set(re.findall(r'docs/background\.md,\s+"([^"]+)"', body))
    assert cited and cited <= heads, cited - heads


def test_make_clean_leaves_the_runs_and_clean_runs_removes_them():
    def commands(target):
        r = subprocess.run(["make", "-n", "-C", str(REPO), target], capture_output=True, text=True, check=True)
        return [line.split() for line in r.stdout.splitlines() if line.startswith("rm ")]

    clean = [w for cmd in commands("clean") for w in cmd]
    assert ".venv" in clean and "runs" not in clean
    assert commands("clean-runs") == [["rm", "-rf", "runs"]]
