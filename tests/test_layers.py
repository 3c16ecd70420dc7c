"""The package layers (docs/design.md, "Package layers"), checked statically with `ast`.

A package imports only packages of lower layers (or itself); no name starting with `_` is imported
from a module in another folder; no two files of degnn/, partitioners/ or benchmarks/ import each
other, directly or round a circle (a package's __init__ that re-exports its modules aside). Imports
inside functions count, and so do module names written as strings in a file that uses importlib
(a registry that imports pipelines by name is an import).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("degnn", "partitioners", "benchmarks")

# lowest first; a package may import its own modules and those of lower layers only
LAYERS = [
    # degnn/compat.py, the version differences, imports only dgl and torch: every layer uses it
    {"degnn", "degnn.config", "degnn.proc", "degnn.startup", "degnn.compat", "degnn.chunked", "degnn.tensor_dict", "degnn.part_csc"},
    {"degnn.data", "degnn.metrics", "degnn.models", "partitioners"},
    {"degnn.runtime"},
    {"degnn.tasks"},
    {"degnn.pipelines", "degnn.partition_cache"},
    {"degnn.entry"},
    # the partitioners' command line loads datasets: it is a command, not the library below
    {"degnn.train", "degnn.launch", "degnn.demo", "partitioners.__main__"},
    {"benchmarks", "degnn.infer", "degnn.reference"},
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
MODULE_STRING = re.compile(r"(?:%s)(?:\.\w+)*(?::\w+)?" % "|".join(ROOTS))


def modules():
    out = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = modules()


def package_of(module: str) -> str:
    """degnn.<name> for degnn's subpackages and top-level modules, the partitioners' command line
    on its own, else the top-level package."""
    parts = module.split(".")
    if module in LAYER:  # a module with a layer of its own
        return module
    if parts[0] == "degnn" or module == "partitioners.__main__":
        return ".".join(parts[:2])
    return parts[0]


def folder_of(module: str) -> Path:
    return MODULES[module].parent


def resolve(module: str, target: str) -> str:
    """The module a dotted import target means: itself if it is one, else its longest module prefix."""
    parts = target.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) or target


def imports(module: str, source: str | None = None, is_package: bool | None = None):
    """(imported module, imported names, line) of every import in a module, lazy ones included
    (the module's own file, or `source` for a module that is not on disk)."""
    if source is None:
        source, is_package = MODULES[module].read_text(), MODULES[module].name == "__init__.py"
    tree = ast.parse(source)
    pkg = module if is_package else module.rsplit(".", 1)[0]
    uses_importlib = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                uses_importlib |= a.name == "importlib"
                if a.name.split(".")[0] in ROOTS:
                    yield resolve(module, a.name), [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in ROOTS:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in MODULES:  # `from pkg import submodule`
                    yield sub, [], node.lineno
                else:
                    yield resolve(module, target), [a.name], node.lineno
    if uses_importlib:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and MODULE_STRING.fullmatch(node.value):
                yield resolve(module, node.value.split(":")[0]), [], node.lineno


def test_every_package_has_a_layer():
    missing = sorted({package_of(m) for m in MODULES} - set(LAYER))
    assert not missing, f"packages without a layer: {missing}: add them to LAYERS here and to docs/design.md"


def upward(module: str, found) -> list:
    bad = []
    for target, _, line in found:
        a, b = package_of(module), package_of(target)
        if a != b and b in LAYER and LAYER[b] >= LAYER.get(a, -1):
            bad.append(f"{module}:{line} imports {target} (layer {LAYER[b]}) from layer {LAYER.get(a)}")
    return bad


def test_no_package_imports_one_above_or_beside_it():
    bad = [b for m in MODULES for b in upward(m, imports(m))]
    assert not bad, "imports that go up or sideways:\n" + "\n".join(bad)


def test_no_private_name_is_imported_from_another_folder():
    bad = []
    for m in MODULES:
        for target, names, line in imports(m):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and target in MODULES and folder_of(target) != folder_of(m):
                bad.append(f"{MODULES[m].relative_to(REPO)}:{line} imports {private} from {target}")
    assert not bad, "private names imported across packages (make them public):\n" + "\n".join(bad)


def cycles(nodes):
    """Strongly connected components with more than one module (Tarjan)."""
    graph = {m: {t for t, _, _ in imports(m) if t in nodes and t != m} for m in nodes}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def defines_something(path: Path) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for n in ast.parse(path.read_text()).body)


def files():
    """Every module but the __init__ files that only hand their modules' names on (a package
    that re-exports its modules is not a circle between them); one that defines things counts."""
    return {m for m, path in MODULES.items() if path.name != "__init__.py" or defines_something(path)}


def test_no_circle_of_imports_between_files():
    found = cycles(files())
    assert found == [], "files that import each other (move what both need into a file of its own):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_catch_what_they_forbid():
    # a runtime module that runs a pipeline, lazily and by name, is caught both ways
    lazy = "def main():\n    from degnn.pipelines import get_pipeline\n"
    assert upward("degnn.runtime.x", imports("degnn.runtime.x", lazy, False))
    by_name = "import importlib\nMODULES = ['degnn.pipelines.lamp.service']\n"
    assert upward("degnn.runtime.x", imports("degnn.runtime.x", by_name, False))
    # sideways: two packages of one layer
    assert upward("degnn.models.x", imports("degnn.models.x", "from degnn.data import load_dataset", False))
    # downward and inside a package are fine
    assert not upward("degnn.pipelines.x", imports("degnn.pipelines.x", "from degnn.runtime import services\n"
                                                   "from . import base", False))
    # the launcher's files: the shared registry keeps isolate -> cleanup -> netns free of circles
    assert ("degnn.launch.cleanup", ["remove_dead_local_runs"]) in [(t, n) for t, n, _ in imports("degnn.launch.isolate")]
    # a circle of two files is found
    two = {"degnn.launch.cleanup", "degnn.launch.isolate"}
    real = imports
    try:
        globals()["imports"] = lambda m: [("degnn.launch.isolate" if m.endswith("cleanup") else "degnn.launch.cleanup", [], 1)]
        assert cycles(two) == [sorted(two)]
    finally:
        globals()["imports"] = real


def test_every_bench_and_partitioner_module_imports_first():
    """A circle through a package's __init__ shows only at run time: `python -m benchmarks.X`
    imports X first, and X's import of benchmarks.report.Y runs report/__init__.py, which must not
    need X half-made. Each module is imported first in a fresh set of the two packages."""
    import importlib
    import sys

    def loaded():
        return {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("benchmarks", "partitioners")}

    ours = [m for m in MODULES if m.split(".")[0] in ("benchmarks", "partitioners") and not m.endswith("__main__")]
    assert ours
    failed, before = [], loaded()
    try:
        for module in ours:
            for name in loaded():
                del sys.modules[name]
            try:
                importlib.import_module(module)
            except ImportError as e:
                failed.append(f"{module}: {e}")
    finally:  # the modules other tests imported (and patch) stay the ones sys.modules holds
        for name in loaded():
            del sys.modules[name]
        sys.modules.update(before)
    assert not failed, "\n".join(failed)
