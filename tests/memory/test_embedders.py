"""Embedders, opening a store from a URL, and keeping ``import statekeep.memory`` light."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import statekeep
from statekeep.db import Database
from statekeep.errors import ConfigError, EmbedderError
from statekeep.memory import (
    Embedder,
    FakeEmbedder,
    InMemoryMemoryStore,
    SentenceTransformerEmbedder,
    open_memory_store,
)
from statekeep.memory.embedders import _default_model_path, _load_model


def test_fake_embedder_is_deterministic_unit_length_and_word_based() -> None:
    """The fake gives the same unit vector for the same text, and shared words mean similarity."""
    e = FakeEmbedder(64)
    a, b, c = e.embed(["green tea please", "green tea please", "quantum chromodynamics"])
    assert isinstance(e, Embedder)
    assert e.name == "fake-hash-64"
    assert np.array_equal(a, b)
    assert np.isclose(np.linalg.norm(a), 1.0)
    assert float(a @ e.embed(["green tea"])[0]) > float(a @ c)


def test_real_embedder_is_minilm_384_loaded_once_and_knows_meaning(
    real_embedder: SentenceTransformerEmbedder,
) -> None:
    """all-MiniLM-L6-v2 gives unit 384-d vectors, from one cached model, closer for paraphrases."""
    v = real_embedder.embed(
        ["The cat sat on the mat.", "A kitten was sitting on a rug.", "Stock prices fell."]
    )
    assert v.shape == (3, 384)
    assert v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3
    assert real_embedder.name == "all-MiniLM-L6-v2"
    assert _load_model(_default_model_path()) is _load_model(_default_model_path())
    assert SentenceTransformerEmbedder().embed(["x"]).shape == (1, 384)  # a second instance shares the model


def test_an_embedder_returning_the_wrong_shape_fails_and_writes_nothing() -> None:
    """A broken embedder raises EmbedderError before anything is stored."""

    class Broken(FakeEmbedder):
        def embed(self, texts):  # type: ignore[no-untyped-def]
            return np.zeros((len(texts), 3), dtype=np.float32)

    store = InMemoryMemoryStore(Broken(8))
    with pytest.raises(EmbedderError, match="shape"):
        store.remember("o", "x")
    assert store.list_memories("o") == []


def test_open_memory_store_picks_the_backend_from_the_url(tmp_path: Path, postgres_url: str) -> None:
    """A folder or lancedb:// opens LanceDB; a postgresql URL or a Database opens pgvector."""
    for target in (str(tmp_path / "a"), f"lancedb://{tmp_path / 'b'}"):
        with open_memory_store(target, FakeEmbedder()) as store:
            assert store.backend == "lancedb"
    with open_memory_store(postgres_url, FakeEmbedder()) as store:
        assert store.backend == "pgvector"
    db = Database(postgres_url)
    assert open_memory_store(db, FakeEmbedder()).backend == "pgvector"
    db.dispose()
    with pytest.raises(ConfigError):
        open_memory_store("redis://x", FakeEmbedder())


def test_importing_the_memory_package_loads_no_heavy_dependency() -> None:
    """import statekeep.memory imports neither torch, sentence-transformers nor lancedb."""
    code = (
        "import sys, statekeep.memory; "
        "print(','.join(m for m in ('torch', 'lancedb', 'sentence_transformers') if m in sys.modules))"
    )
    src = str(Path(statekeep.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ""


def test_the_numpy_encoder_gives_sentence_transformers_vectors() -> None:
    """A few texts run through numpy, many through sentence-transformers: the vectors agree to 1e-5."""
    from sentence_transformers import SentenceTransformer

    texts = [
        "Alice prefers green tea in the morning.",
        "",
        "Ünïcödé façade naïve café — 東京 🚀",
        "word " * 400,  # longer than the model's 256 tokens: truncated alike
        "INC-20931",
    ]
    few = np.concatenate([SentenceTransformerEmbedder().embed([t]) for t in texts])
    reference = SentenceTransformer(_default_model_path(), device="cpu")
    expected = reference.encode(texts, normalize_embeddings=True)
    assert np.abs(few - expected).max() < 1e-5
    many = SentenceTransformerEmbedder().embed(texts * 2)  # more than FEW: sentence-transformers
    assert np.abs(many[: len(texts)] - expected).max() < 1e-5


def test_embedding_a_query_imports_neither_torch_nor_sentence_transformers() -> None:
    """A process that only embeds a query (a search) never pays for importing torch."""
    code = (
        "import sys; from statekeep.memory import SentenceTransformerEmbedder; "
        "v = SentenceTransformerEmbedder().embed(['what does Alice drink?']); assert v.shape == (1, 384); "
        "print(','.join(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules))"
    )
    src = str(Path(statekeep.__file__).parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "HF_HUB_OFFLINE": "1",
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ""
