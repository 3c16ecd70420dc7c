"""Every file a comment, docstring or document names exists, and every section it names is there.

Paths of the forms degnn/...py, partitioners/...py, benchmarks/...py, tests/...py, conf/...yaml and
docs/...md anywhere in a tracked text file must be files of the repository; a section cited as
`docs/NAME.md, "Heading"` (or `docs/NAME.md#anchor`) must be a heading of that file, and so must a
Markdown file's relative links and their anchors.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".sh", ".txt", "Makefile")
PATH = re.compile(r"(?<![\w./-])((?:degnn|tests|partitioners|benchmarks)/[\w./-]*\w\.py|conf/[\w./-]*\w\.yaml"
                  r"|docs/[\w./-]*\w\.md)\b")
SECTION = re.compile(r"(docs/[\w-]+\.md),\s+\"([^\"\n]+)")
ANCHOR = re.compile(r"(docs/[\w-]+\.md)#([\w-]+)")
LINK = re.compile(r"\]\(([^)\s:]+)\)")  # a Markdown link to a file of the repository


def tracked_text_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in out.decode().split("\0"):
        path = REPO / name
        # this file's own examples name what does not exist on purpose
        if name.endswith(SUFFIXES) and path.is_file() and path != Path(__file__).resolve():
            yield name, path.read_text(errors="replace")


def markdown_headings(doc: str):
    """The file's `#` headings, in order."""
    text = (REPO / doc).read_text() if (REPO / doc).is_file() else ""
    return [h.strip() for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)]


def headings(doc: str):
    """The file's headings, and the bold run-in titles its paragraphs open with (**Title.**)."""
    text = (REPO / doc).read_text() if (REPO / doc).is_file() else ""
    titles = [t.rstrip(".:").strip() for t in re.findall(r"^\*\*([^*\n]+)\*\*", text, re.MULTILINE)]
    return markdown_headings(doc) + titles


def names(heading: str, title: str) -> bool:
    """Whether a citation's title names the heading: all of it, or its first words (a title a
    line wraps, or one that leaves off the heading's tail: "The run directory (a contract)")."""
    return heading == title or heading.startswith(title) and not heading[len(title)].isalnum()


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(doc: str) -> set:
    """Every anchor of a file's headings; GitHub numbers a repeated one (-1, -2, ...)."""
    out, seen = set(), {}
    for h in markdown_headings(doc):  # a bold run-in title has no anchor
        a = anchor(h)
        out.add(f"{a}-{seen[a]}" if a in seen else a)
        seen[a] = seen.get(a, 0) + 1
    return out


def missing(name: str, text: str):
    for n, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            path = m.group(1)
            if not (REPO / path).is_file():
                yield f"{name}:{n}: {path} does not exist"
        for m in SECTION.finditer(line):
            doc, title = m.group(1), m.group(2).strip()
            if not any(names(h, title) for h in headings(doc)):
                yield f"{name}:{n}: {doc} has no section \"{title}\""
        for m in ANCHOR.finditer(line):
            doc, tag = m.groups()
            if tag not in anchors(doc):
                yield f"{name}:{n}: {doc} has no section #{tag}"
        for m in LINK.finditer(line) if name.endswith(".md") else ():
            path, _, tag = m.group(1).partition("#")
            doc = os.path.normpath(os.path.join(os.path.dirname(name), path)) if path else name
            if not (REPO / doc).exists():
                yield f"{name}:{n}: the link to {m.group(1)} names no file"
            elif tag and doc.endswith(".md") and tag not in anchors(doc):
                yield f"{name}:{n}: {doc} has no section #{tag}"


def test_every_named_file_and_section_exists():
    bad = [b for name, text in tracked_text_files() for b in missing(name, text)]
    assert not bad, "fix the name (or the file/section it points to):\n" + "\n".join(bad)


def test_the_check_catches_each_kind():
    assert list(missing("x.py", "# see degnn/pipelines/nothing_here.py"))
    assert list(missing("x.py", "(tests/test_nothing_here.py)"))
    assert list(missing("x.md", "[more](docs/nothing-here.md)"))
    assert list(missing("x.py", '# (docs/design.md, "No such section")'))
    assert list(missing("x.md", "[tma](docs/limitations.md#no-such-section)"))
    assert not list(missing("x.py", "# degnn/config.py and tests/test_doc_paths.py, docs/design.md"))
    assert list(missing("x.py", "# degnn/bench/gone.py, conf/pipeline/gone.yaml, partitioners/gone.py"))
    assert not list(missing("x.py", "# benchmarks/records.py, conf/pipeline/lamp.yaml, partitioners/folder.py"))
    assert list(missing("x.py", '# (docs/design.md, "Machine lim")'))
    assert list(missing("docs/x.md", "[more](nothing-here.md)"))
    assert list(missing("docs/x.md", "[limits](design.md#no-such-section)"))
    assert not list(missing("docs/x.md", "[limits](design.md#machine-limits), [top](../README.md)"))
    assert not list(missing("x.md", "[tma](docs/limitations.md#tma)"))
    assert not list(missing("x.py", '# (docs/design.md, "Machine limits"), (docs/design.md, "The run'))
