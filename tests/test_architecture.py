"""The folder is the architecture: store packages import one way, and never each other's private names.

Imports are read from the source (``ast``); those under ``if TYPE_CHECKING:`` are
annotations only and are not counted as edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "statekeep"
STORES = ["context", "working", "workflow", "memory"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of each import that runs at import time or call time (not TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).rstrip(".")
            found.append((base, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
    return found


def _modules(store: str) -> dict[str, Path]:
    return {_module_name(p): p for p in (SRC / store).rglob("*.py")}


def test_no_workflow_module_imports_a_private_name_of_another() -> None:
    """Inside the workflow package, no module reaches into another's private (underscored) names."""
    offenders = []
    for name, path in _modules("workflow").items():
        for module, names in _runtime_imports(path):
            if module.startswith("statekeep") and module != name:
                offenders += [f"{name} imports {module}.{n}" for n in names if n.startswith("_")]
    assert offenders == []


@pytest.mark.parametrize("store", STORES)
def test_no_import_cycle_inside_a_store(store: str) -> None:
    """The import graph of each store package (module level and deferred imports alike) has no cycle."""
    modules = _modules(store)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in _runtime_imports(path):
            targets = {module} | {f"{module}.{n}" for n in names}
            graph[name] |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    # a package's __init__ re-exports its modules; edges into it from its own modules are cycles too
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_workflow_package_writes_sql_only_in_its_sql_backend() -> None:
    """Engine, run context, ledger and waits never import SQLAlchemy: they go through the contract."""
    for module in ("engine", "run_context", "execution", "tools", "waits", "worker"):
        imported = {m for m, _ in _runtime_imports(SRC / "workflow" / f"{module}.py")}
        assert not any(m.startswith("sqlalchemy") for m in imported), module


def test_each_input_limit_is_defined_once() -> None:
    """The id limit and the other input limits are constants of statekeep._check, not copies."""
    copies = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if any(n in {"MAX_ID", "MAX_OWNER", "MAX_INT", "MAX_SECONDS", "MAX_DEPTH"} for n in names):
                    copies.append(f"{path.relative_to(SRC)}: {names}")
    assert sorted(copies) == sorted(
        f"_check.py: {[n]}" for n in ("MAX_ID", "MAX_INT", "MAX_SECONDS", "MAX_DEPTH")
    )


def test_every_error_class_is_raised_or_is_the_kind_of_one_that_is() -> None:
    """No dead branches in the error tree: each class is raised somewhere, or is a base of one that is."""
    import statekeep.errors as errors

    classes = {
        name: cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.StatekeepError)
    }
    source = "\n".join(p.read_text() for p in SRC.rglob("*.py") if p.name != "errors.py")
    raised = {name for name in classes if f"{name}(" in source}
    dead = [
        name
        for name, cls in classes.items()
        if name not in raised and not any(issubclass(classes[r], cls) for r in raised)
    ]
    assert dead == []


def test_each_error_has_one_kind() -> None:
    """One axis: every error class has exactly one statekeep base (a kind), never a second store axis."""
    import statekeep.errors as errors

    mixed = [
        name
        for name, cls in vars(errors).items()
        if isinstance(cls, type)
        and issubclass(cls, errors.StatekeepError)
        and sum(issubclass(b, errors.StatekeepError) for b in cls.__bases__) > 1
    ]
    assert mixed == []


def test_the_documented_error_tree_is_the_real_one() -> None:
    """The tree in the error reference names every error class once, under its real base."""
    import re

    import statekeep.errors as errors

    page = (SRC.parents[1] / "docs" / "reference" / "config.md").read_text()
    block = page.split("```text\n", 1)[1].split("```", 1)[0]
    drawn: dict[str, str | None] = {}
    parents: list[str] = []
    for line in block.splitlines():
        name = re.sub(r"^[│├└─\s]+", "", line)
        depth = (len(line) - len(name)) // 4
        parents[depth:] = [name]
        drawn[name] = parents[depth - 1] if depth else None
    real = {
        name: next((b.__name__ for b in cls.__bases__ if issubclass(b, errors.StatekeepError)), None)
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.StatekeepError)
    }
    assert drawn == real


# --- the house plan (issue 41) ------------------------------------------------------------


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def _top_level_names(path: Path) -> set[str]:
    """Names a module defines itself: functions, classes and assigned names at module level."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If | ast.Try):  # definitions guarded by a version or import check
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
                    names.add(stmt.name)
                elif isinstance(stmt, ast.Assign):
                    names |= {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_no_module_imports_a_private_name_of_another() -> None:
    """No module anywhere in the package takes an underscored name from another (a private module is fine)."""
    modules = _all_modules()
    offenders = []
    for name, path in modules.items():
        for module, names in _runtime_imports(path):
            if module.startswith("statekeep") and module != name:
                offenders += [
                    f"{name} imports {module}.{n}"
                    for n in names
                    if n.startswith("_") and not n.startswith("__") and f"{module}.{n}" not in modules
                ]
    assert offenders == []


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    """No re-export shims: a name comes from its own module; only a package's __init__ gathers names."""
    modules = _all_modules()
    defined = {name: _top_level_names(path) for name, path in modules.items()}
    offenders = []
    for name, path in modules.items():
        for module, names in _runtime_imports(path):
            if module not in modules or modules[module].name == "__init__.py":
                continue
            offenders += [
                f"{name} imports {n} from {module}"
                for n in names
                if n not in defined[module] and f"{module}.{n}" not in modules
            ]
    assert offenders == []


def test_no_dialect_name_outside_the_dialect_hooks() -> None:
    """Dialect differences are named hooks in db/dialects.py: no branch on a backend's name elsewhere."""

    def names_a_backend(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in {"sqlite", "postgresql"}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(names_a_backend(e) for e in node.elts)
        return ast.unparse(node).endswith("dialect.name")

    found = [
        f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}"
        for path in SRC.rglob("*.py")
        if path != SRC / "db" / "dialects.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare) and any(map(names_a_backend, [node.left, *node.comparators]))
    ]
    assert found == []


@pytest.mark.parametrize("store", STORES)
def test_no_class_of_a_store_inherits_a_non_contract_class_of_its_own_package(store: str) -> None:
    """A backend extends its store's contract (an abstract class) or a record, never half of another class."""
    import importlib
    import inspect
    from abc import ABC

    from pydantic import BaseModel

    offenders = []
    package = f"statekeep.{store}"
    for name in sorted(_modules(store)):
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            for base in cls.__bases__:
                if not base.__module__.startswith(package):
                    continue
                # the store's contract: its base module's, or a class declared abstract itself
                contract = base.__module__ == f"{package}.base" or ABC in base.__bases__
                record = base.__module__.endswith("._types") or issubclass(base, BaseModel | Exception)
                if not (contract or record):
                    offenders.append(f"{name}.{cls.__name__}({base.__module__}.{base.__name__})")
    assert offenders == []


def test_every_store_is_declared_once_in_the_one_list() -> None:
    """Each StoreSpec in the package is named by statekeep.stores, and each store's name once."""
    from statekeep.stores import DECLARATIONS

    declared: list[str] = []
    for name, path in _all_modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.AnnAssign | ast.Assign) and "StoreSpec(" in ast.unparse(
                node.value or node
            ):
                target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
                declared.append(f"{name}:{ast.unparse(target)}")
    assert sorted(declared) == sorted(DECLARATIONS.values())
    assert {"context", "working", "workflow", "memory", "keys", "agents", "langgraph"} <= set(DECLARATIONS)


CROSS_CUTTING = ["erasure", "keys.reseal", "_open", "cli.upkeep", "web.stores", "runtime.core"]


@pytest.mark.parametrize("module", CROSS_CUTTING)
def test_cross_cutting_work_reads_the_list_not_the_stores_tables(module: str) -> None:
    """Erasure, re-sealing, upgrade, opening, the runtime and the console import no declaring module."""
    from statekeep.stores import DECLARATIONS

    declaring = {path.partition(":")[0] for path in DECLARATIONS.values()} - {"statekeep.stores"}
    path = SRC.joinpath(*module.split(".")).with_suffix(".py")
    imported = {m for m, _ in _runtime_imports(path)}
    imported |= {f"{m}.{n}" for m, names in _runtime_imports(path) for n in names}
    # keys.reseal re-seals with its own package's ring; the runtime and the CLI write the audit log
    own = f"statekeep.{module.rpartition('.')[0]}." if "." in module else "statekeep.audit"
    assert {m for m in imported & declaring if not m.startswith(own) and m != "statekeep.audit"} == set()


def test_the_settings_give_a_url_to_each_store_the_list_keeps_tables_in() -> None:
    """config's per-store URLs are exactly the homes the declarations name (lives_in)."""
    from statekeep.config import SQL_STORES
    from statekeep.stores import declared

    assert set(SQL_STORES) == {spec.lives_in for spec in declared() if spec.lives_in is not None}
