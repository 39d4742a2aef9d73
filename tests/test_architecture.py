"""The layering rules of docs/ARCHITECTURE.md, checked on the source (ast), not by convention:
imports flow one way (faces -> application -> library), no import cycles between modules, no file over
~400 lines without a stated reason, and the public API the README documents."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "torchboost"
LIBRARY = ("models", "data", "optim", "train", "boost", "distributed", "migrate", "compat", "deploy", "errors", "fileio",
           "losses", "seed")
APPLICATION = ("recipe", "race")
FACES = ("cli", "commands", "bench", "debug", "__main__")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every torchboost module `path` imports, at module level or inside functions (TYPE_CHECKING too)."""
    mod = module_name(path, root)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            found |= {n for n in [target, *names] if n.startswith("torchboost")}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("torchboost")}
    return found


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def resolve(name: str) -> str | None:
    """The module an imported name lives in (`torchboost.optim.THOR` -> `torchboost.optim`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


GRAPH = {mod: {r for r in map(resolve, imports_of(path)) if r and r != mod} for mod, path in MODULES.items()}


def layer(mod: str) -> str:
    top = mod.split(".")[1] if "." in mod else ""
    if top in APPLICATION:
        return "application"
    if top in FACES:
        return "face"
    return "library" if top in LIBRARY else "root"


def test_library_never_imports_application_or_faces():
    bad = [(m, d) for m, deps in GRAPH.items() if layer(m) == "library" for d in deps
           if layer(d) in ("application", "face")]
    assert not bad, f"library modules importing the application layer or the CLI: {bad}"


def test_application_never_imports_faces():
    bad = [(m, d) for m, deps in GRAPH.items() if layer(m) == "application" for d in deps if layer(d) == "face"]
    assert not bad, bad


def test_the_recipe_never_imports_the_race():
    """`race/` builds its runs with `recipe/`; `recipe/` (a config becomes a run) knows nothing of the race."""
    bad = [(m, d) for m, deps in GRAPH.items() if m.startswith("torchboost.recipe") for d in deps
           if d.startswith("torchboost.race")]
    assert not bad, bad


def test_no_import_cycles():
    # A package's __init__ re-exporting its own submodules is not a cycle of concerns: drop edges from a
    # package to its children, then look for any cycle (iterative DFS with colours).
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in GRAPH.items()}
    colour, cycles = {}, []

    def visit(start: str) -> None:
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        colour[start] = "grey"
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = "black"
                stack.pop()
                path.pop()
            elif colour.get(nxt) == "grey":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in colour:
                colour[nxt] = "grey"
                stack.append((nxt, iter(sorted(edges[nxt]))))
                path.append(nxt)

    for mod in sorted(edges):
        if mod not in colour:
            visit(mod)
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_graph_sees_a_planted_violation(tmp_path):
    """The checks above must be able to fail: a library module importing the application layer is seen."""
    planted = tmp_path / "torchboost" / "models" / "bad.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from torchboost.recipe.config import Config\nfrom ..recipe import run\n")
    deps = imports_of(planted, tmp_path / "torchboost")
    assert {"torchboost.recipe.config", "torchboost.recipe.run"} <= deps
    assert layer("torchboost.models.bad") == "library" and layer("torchboost.recipe.run") == "application"


def test_files_over_400_lines_are_the_ones_the_map_lists_with_their_reason():
    """Measured: every module's length. The map's table of big files is exactly the set over 400 lines (a
    file that shrank leaves the table, one that grew joins it), and each file's top states the table's reason."""
    doc = (ROOT.parent / "docs" / "ARCHITECTURE.md").read_text()
    table = doc[doc.index("### Files over 400 lines"):].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `(torchboost/[^`]+)` \| (.+?) \|$", table, re.M))
    big = {str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py") if len(p.read_text().splitlines()) > 400}
    assert set(listed) == big
    for path, why in listed.items():
        head = " ".join(" ".join((ROOT.parent / path).read_text().splitlines()[:15]).split())
        assert why in head, f"{path}: its top does not say {why!r}"


def test_public_api_matches_the_docs():
    import torchboost
    import torchboost.distributed
    import torchboost.optim

    for mod, names in ((torchboost, ("THOR", "TrainStep", "ProgressBar", "TensorBoard", "Model", "EarlyStopping",
                                     "get_thor_lr", "get_thor_damping", "ModelEMA", "create_model")),
                       (torchboost.optim, ("THOR", "get_thor_lr", "get_thor_damping")),
                       (torchboost.distributed, ("adasum_reduce", "launch", "init_distributed", "wrap_ddp"))):
        for name in names:
            assert name in mod.__all__ and getattr(mod, name) is not None, f"{mod.__name__}.{name}"
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.__all__ lists missing {name}"


PACKAGES = sorted(module_name(p) for p in ROOT.rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_export_explicitly(package):
    """Every package lists its names in `__all__`. A module `__getattr__` is allowed for one thing only: the
    names of its `_EXPORTS` table (name -> module, imported on first use so that `import torchboost` and the
    CLI's start need no torch), each listed in `__all__` and found in its module; any other name is an
    AttributeError, as without one."""
    mod = importlib.import_module(package)
    assert isinstance(mod.__all__, list) and all(hasattr(mod, name) for name in mod.__all__), package
    if not hasattr(mod, "__getattr__"):
        return
    exports = getattr(mod, "_EXPORTS", None)
    assert isinstance(exports, dict) and exports, f"{package} has a module __getattr__ without an _EXPORTS table"
    assert set(exports) <= set(mod.__all__), f"{package}._EXPORTS names missing from __all__"
    for name, module in exports.items():
        assert getattr(mod, name) is getattr(importlib.import_module(module), name), f"{package}.{name}"
    with pytest.raises(AttributeError):
        mod.__getattr__("no_such_name")
