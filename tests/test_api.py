"""The public API: a small, sorted, complete front door, and one exception tree."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import statekeep
from statekeep import errors


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted, and every name in it exists."""
    assert statekeep.__all__ == sorted(statekeep.__all__)
    for name in statekeep.__all__:
        assert hasattr(statekeep, name), name


def test_every_error_derives_from_the_root() -> None:
    """Every exception class in errors.py is a StatekeepError, except Suspended (control flow)."""
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    for cls in classes:
        if cls is errors.Suspended:
            assert not issubclass(cls, Exception)
            assert issubclass(cls, BaseException)
        else:
            assert issubclass(cls, errors.StatekeepError), cls


def test_import_is_light() -> None:
    """import statekeep imports no torch, lancedb, sentence-transformers, tiktoken, SQLAlchemy or pydantic."""
    code = (
        "import sys, statekeep; "
        "heavy = ('torch', 'lancedb', 'sentence_transformers', 'tiktoken', 'sqlalchemy', 'pydantic'); "
        "heavy = [m for m in heavy if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    src = str(Path(statekeep.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == ""


def test_all_lists_every_public_name_of_the_package() -> None:
    """Every public (non-module) name of statekeep/__init__.py, bound or lazy, is in __all__."""
    import types

    public = {
        n for n, v in vars(statekeep).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    assert public | set(statekeep._LAZY) == set(statekeep.__all__)
    assert all(getattr(statekeep, name) is not None for name in statekeep._LAZY)


def test_every_docstring_example_in_the_package_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``>>>`` example gives the output it shows (the CLI entry point and the demo excepted)."""
    import doctest
    import importlib
    import pkgutil

    monkeypatch.chdir(tmp_path)  # examples that open a store in a relative folder write here
    failed, attempted = 0, 0
    for info in pkgutil.walk_packages(statekeep.__path__, "statekeep."):
        if info.name == "statekeep.__main__" or info.name.startswith("statekeep.demo"):
            continue
        result = doctest.testmod(importlib.import_module(info.name), optionflags=doctest.ELLIPSIS)
        failed, attempted = failed + result.failed, attempted + result.attempted
    assert failed == 0
    assert attempted >= 80
