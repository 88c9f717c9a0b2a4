"""The layers of pipelines/DESIGN.md, checked on the source: imports point down only
(pipelines -> transforms -> kernels -> schemas), kernels never import Beam, and every task has
its pieces under the same names."""

from __future__ import annotations

import ast
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("classification", "detection", "segmentation", "text", "retrieval")


def imports_of(folder: str):
    """(file, imported module) for every import under folder, lazy ones included."""
    for base, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(base, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    yield os.path.relpath(path, ROOT), node.module
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        yield os.path.relpath(path, ROOT), alias.name


@pytest.mark.parametrize("folder, forbidden", [
    ("transforms", ("evalbeam.pipelines",)),
    ("schemas", ("evalbeam.pipelines", "evalbeam.transforms")),
    ("transforms/kernels", ("evalbeam.pipelines", "apache_beam")),
])
def test_imports_point_down(folder, forbidden):
    upward = sorted({(path, module) for path, module in imports_of(folder)
                     if module.startswith(forbidden)})
    assert upward == []


def test_no_import_cycles():
    """Lazy imports count too (a cycle hidden in a function is still a cycle to read); imports
    under `if TYPE_CHECKING:` do not run and are left out."""
    graph: dict = {}
    for folder in ("pipelines", "transforms", "schemas"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(base, name)
                module = "evalbeam." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                module = module.removesuffix(".__init__")
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                hidden = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                          and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
                graph[module] = {node.module for node in ast.walk(tree)
                                 if isinstance(node, ast.ImportFrom) and id(node) not in hidden
                                 and (node.module or "").startswith("evalbeam.")}
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
    assert cycles == []


def test_every_import_uses_the_evalbeam_namespace():
    bare = sorted({(path, module) for folder in ("pipelines", "transforms", "schemas")
                   for path, module in imports_of(folder)
                   if module.split(".")[0] in ("pipelines", "transforms", "schemas")})
    assert bare == []


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_its_pieces_under_the_same_names(task):
    from evalbeam.pipelines.registry import spec_of

    spec = spec_of(task)
    assert spec.name == task and spec.transforms == f"evalbeam.transforms.{task}"
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
    assert os.path.exists(os.path.join(ROOT, "pipelines", f"{task}.md"))
