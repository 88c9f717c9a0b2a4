"""The layers of pipelines/DESIGN.md, checked on the source: imports point down only
(pipelines -> transforms -> kernels -> schemas), kernels never import Beam, no module imports
itself back through others, no module reaches for another's private names, and every task has
its pieces under the same names.

The import graph is resolved to modules: `from evalbeam.pipelines.sweep import finishing` is an
import of the module `evalbeam.pipelines.sweep.finishing`, not of its package, and
`from evalbeam.pipelines.quality.gates import parse_gates` is an import of `parse_gates` from
`evalbeam.pipelines.quality.gates`. Lazy imports (inside functions) count: a cycle or a private
name hidden in a function is still one to read. Imports under `if TYPE_CHECKING:` never run and
are left out."""

from __future__ import annotations

import ast
import functools
import importlib
import os
from typing import NamedTuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("classification", "detection", "segmentation", "text", "retrieval")
FOLDERS = ("pipelines", "transforms", "schemas")


def module_of(path: str) -> str:
    """The dotted name a source file installs as: pipelines/sweep/command.py ->
    evalbeam.pipelines.sweep.command; a package's __init__.py is the package."""
    return ("evalbeam." + path[:-3].replace(os.sep, ".")).removesuffix(".__init__")


def source_files() -> dict:
    """{module name: path relative to ROOT} for every .py file under the source folders."""
    found = {}
    for folder in FOLDERS:
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.relpath(os.path.join(base, name), ROOT)
                    found[module_of(path)] = path
    return found


MODULES = source_files()


class Import(NamedTuple):
    """One imported thing. `module` is resolved: `from P import M` gives module P.M (and name
    None) when P.M is one of ours, module P and name M otherwise."""

    path: str          # the importing file, relative to ROOT
    line: int
    module: str
    name: str | None   # the name taken from `module`; None for the module itself
    alias: str         # the name it is bound to in the importing file
    level: int         # > 0 for a relative import (`from . import x`)


@functools.cache
def parsed(path: str) -> ast.Module:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def type_checking_only(tree: ast.Module) -> set:
    """The ids of the nodes in the body of an `if TYPE_CHECKING:` (its else branch runs)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
            for statement in node.body for n in ast.walk(statement)}


@functools.cache
def imports_in(path: str) -> tuple:
    """Every Import in one file that runs, lazy ones included."""
    return tuple(imports_of_tree(path, parsed(path)))


def imports_of_tree(path: str, tree: ast.Module):
    hidden = type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield Import(path, node.lineno, a.name, None, a.asname or a.name.split(".")[0], 0)
        elif isinstance(node, ast.ImportFrom):
            package = node.module or ""
            for a in node.names:
                submodule = f"{package}.{a.name}" if package else a.name
                if submodule in MODULES:
                    yield Import(path, node.lineno, submodule, None, a.asname or a.name, node.level)
                else:
                    yield Import(path, node.lineno, package, a.name, a.asname or a.name,
                                 node.level)


def imports_under(folder: str):
    """Every Import of the modules under folder (a path relative to ROOT, with '/')."""
    for path in MODULES.values():
        if path.startswith(folder + os.sep):
            yield from imports_in(path)


def listed(offenders) -> str:
    """The offenders one a line, for a failure message."""
    return "\n  " + "\n  ".join(offenders)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# folder -> what its modules may import of evalbeam (anything else of evalbeam is upward), and
# outside packages they must not import
LAYERS = {
    "pipelines": (("evalbeam.pipelines", "evalbeam.transforms", "evalbeam.schemas"), ()),
    "transforms": (("evalbeam.transforms", "evalbeam.schemas"), ()),
    "transforms/kernels": (("evalbeam.transforms.kernels", "evalbeam.schemas"), ("apache_beam",)),
    "schemas": (("evalbeam.schemas",), ()),
}


def within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_imports_point_down(folder):
    """pipelines/ (every sub-package) may import transforms/ and schemas/; transforms/ never
    pipelines/; kernels only kernels and schemas, and never Beam; schemas only schemas."""
    allowed, outside = LAYERS[folder]
    upward = sorted({f"{i.path}:{i.line} imports {i.module}" for i in imports_under(folder)
                     if (within(i.module, ("evalbeam",)) and not within(i.module, allowed))
                     or within(i.module, outside)})
    assert upward == [], f"imports that point up from {folder}/ (DESIGN.md):" + listed(upward)


def import_graph() -> dict:
    """{module: the evalbeam modules it imports}, every source module a key."""
    graph = {module: set() for module in MODULES}
    for module, path in MODULES.items():
        for i in imports_in(path):
            if i.module in MODULES and i.module != module:
                graph[module].add(i.module)
    return graph


def cycles_of(graph: dict) -> list:
    """The import cycles, each once as [a, b, ..., a], found by depth-first search."""
    done, cycles = set(), []

    def visit(module, stack):
        if module in stack:
            cycles.append(stack[stack.index(module):] + [module])
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, stack + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return cycles


def test_imports_resolve_to_modules_and_cycles_are_found():
    """What the other tests rely on: a module taken from its package is that module, a name
    taken from a module is that name, lazy imports count and TYPE_CHECKING ones do not."""
    tree = ast.parse("from evalbeam.pipelines.sweep import finishing as sweep_finishing\n"
                     "from evalbeam.pipelines.quality.gates import _number\n"
                     "from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n"
                     "    from evalbeam.pipelines.sweep import plan\n"
                     "def lazy():\n"
                     "    from evalbeam.transforms import io\n")
    found = {(i.module, i.name, i.alias) for i in imports_of_tree("example.py", tree)}
    assert found == {("evalbeam.pipelines.sweep.finishing", None, "sweep_finishing"),
                     ("evalbeam.pipelines.quality.gates", "_number", "_number"),
                     ("typing", "TYPE_CHECKING", "TYPE_CHECKING"),
                     ("evalbeam.transforms.io", None, "io")}
    assert cycles_of({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycles():
    cycles = [" -> ".join(cycle) for cycle in cycles_of(import_graph())]
    assert cycles == [], "modules that import themselves back through others:" + listed(cycles)


def test_no_private_names_across_modules():
    """A name starting with "_" (dunders aside) belongs to its module: another module that needs
    it wants it public, under a name that says what it is, or moved to where both can use it.
    Taken by `from m import _x` or as `m._x` on an imported module."""
    taken = set()
    for module, path in MODULES.items():
        tree = parsed(path)
        ours = {}   # name bound in this file -> the evalbeam module it is
        for i in imports_in(path):
            if not within(i.module, ("evalbeam",)) or i.module == module:
                continue
            if i.name is not None and is_private(i.name):
                taken.add(f"{path}:{i.line} imports {i.name} from {i.module}")
            if i.name is None and i.module in MODULES and i.alias != "evalbeam":
                ours[i.alias] = i.module
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ours and is_private(node.attr)):
                taken.add(f"{path}:{node.lineno} uses {node.attr} of {ours[node.value.id]}")
    taken = sorted(taken)
    assert taken == [], "private names taken from another module:" + listed(taken)


def test_every_import_uses_the_evalbeam_namespace():
    """Installed, the folders are evalbeam.pipelines, .transforms and .schemas: a bare
    `import transforms` would find a user's own package of that name, and a relative import
    hides which layer it reaches."""
    bare = sorted({f"{i.path}:{i.line} imports {'.' * i.level}{i.module}"
                   for folder in FOLDERS for i in imports_under(folder)
                   if i.level or i.module.split(".")[0] in FOLDERS})
    assert bare == [], "imports outside the evalbeam namespace:" + listed(bare)


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_its_pieces_under_the_same_names(task):
    from evalbeam.pipelines.tasks.registry import task_of

    spec = task_of(task)
    assert spec.name == task and spec.plumbing == f"evalbeam.transforms.{task}"
    title = task.capitalize()
    assert spec.files_transform().__name__ == f"Evaluate{title}Files"
    assert spec.pcollection_transform().__name__ == f"Evaluate{title}"
    plumbing = importlib.import_module(f"evalbeam.transforms.{task}")
    kernel = importlib.import_module(f"evalbeam.transforms.kernels.{task}")
    for name in (f"Evaluate{title}Files", f"Evaluate{title}", f"Match{title}",
                 f"{title}RowsFromDicts", "record_sort_key"):
        assert hasattr(plumbing, name), f"transforms/{task}.py has no {name}"
    for name in (f"{title}Config", f"{title}State", "state_records"):
        assert hasattr(kernel, name), f"transforms/kernels/{task}.py has no {name}"
    state = getattr(kernel, f"{title}State")
    assert callable(getattr(state, "copy", None)) and callable(getattr(state, "merge", None))
    assert os.path.exists(os.path.join(ROOT, "schemas", f"{task}_rows.py"))
    assert os.path.exists(os.path.join(ROOT, "pipelines", "tasks", f"{task}.md"))
