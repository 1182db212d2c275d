"""A sentence-transformers BERT model (mean pooling) run with numpy alone; the caller normalizes.

Importing sentence-transformers pulls in transformers, torch, scikit-learn and
scipy: ten seconds and more before the first query on a busy machine, which a
command line pays on every call. A small BERT encoder such as the default
all-MiniLM-L6-v2 needs none of them: its weights load with ``safetensors``, its
tokenizer with ``tokenizers`` (both light, both installed with
sentence-transformers), and the forward pass is a few matrix products. The
vectors equal sentence-transformers' to float32 rounding (a test compares them).

:func:`load` returns None for any model this does not cover (another
architecture, pooling or module list), and the caller uses sentence-transformers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
#: Up to this many tokens in a batch, products run in einsum's loop rather than BLAS.
SMALL = 256

#: The module list of a plain sentence-transformers BERT: encoder, pooling, normalization.
_MODULES = [
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
]


class BertEncoder:
    """A BERT sentence encoder: tokens, six (or n) transformer layers, mean pooling, unit length."""

    def __init__(self, folder: Path, config: dict[str, Any], max_length: int) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.weights: dict[str, F32] = load_file(str(folder / "model.safetensors"))
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.dimension = int(config["hidden_size"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()
        self.max_length = max_length

    def get_sentence_embedding_dimension(self) -> int:
        """The vector length (as sentence-transformers names it)."""
        return self.dimension

    def encode(self, texts: Sequence[str], batch_size: int = 32, **_: Any) -> F32:
        """Mean-pooled vectors of ``texts`` (not yet unit length), batched by length, in the order given.

        Takes sentence-transformers' ``encode`` options; the caller normalizes.
        """
        encodings = self.tokenizer.encode_batch(list(texts))
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            out[chunk] = self._forward([encodings[i].ids for i in chunk])
        return out

    def _forward(self, batch: list[list[int]]) -> F32:
        width = max(len(ids) for ids in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.float32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1.0
        w = self.weights
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:width]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = self._norm(x, "embeddings.LayerNorm")
        bias = (1.0 - mask)[:, None, None, :] * np.float32(np.finfo(np.float32).min)
        for layer in range(self.layers):
            x = self._layer(x, bias, f"encoder.layer.{layer}.")
        summed = (x * mask[:, :, None]).sum(axis=1)
        pooled: F32 = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        return pooled

    def _layer(self, x: F32, bias: F32, p: str) -> F32:
        n, t, d = x.shape
        h = self.heads
        q, k, v = (self._dense(x, f"{p}attention.self.{m}") for m in ("query", "key", "value"))
        q, k, v = (a.reshape(n, t, h, d // h).transpose(0, 2, 1, 3) for a in (q, k, v))
        scores = np.einsum("nhtd,nhsd->nhts", q, k) / np.float32(np.sqrt(d // h)) + bias
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        attended = np.einsum("nhts,nhsd->nhtd", scores / scores.sum(axis=-1, keepdims=True), v)
        attended = attended.transpose(0, 2, 1, 3).reshape(n, t, d)
        x = self._norm(
            self._dense(attended, f"{p}attention.output.dense") + x, f"{p}attention.output.LayerNorm"
        )
        inner = _gelu(self._dense(x, f"{p}intermediate.dense"))
        return self._norm(self._dense(inner, f"{p}output.dense") + x, f"{p}output.LayerNorm")

    def _dense(self, x: F32, name: str) -> F32:
        flat = x.reshape(-1, x.shape[-1])
        weight = self.weights[f"{name}.weight"]
        # a few tokens (a query): einsum's own loop, one core; a threaded BLAS would wait for a
        # second core that a busy machine hands out late. Many: one BLAS product over all tokens.
        product = np.einsum("td,od->to", flat, weight) if len(flat) <= SMALL else flat @ weight.T
        out: F32 = (product + self.weights[f"{name}.bias"]).reshape(*x.shape[:-1], -1)
        return out

    def _norm(self, x: F32, name: str) -> F32:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        out: F32 = (x - mean) / np.sqrt(var + self.eps) * self.weights[f"{name}.weight"]
        return out + self.weights[f"{name}.bias"]


def _gelu(x: F32) -> F32:
    """BERT's exact GELU, x * Phi(x), with erf to about 1e-7 (Abramowitz and Stegun 7.1.26)."""
    z = np.abs(x) * np.float32(1 / np.sqrt(2))
    t = 1 / (1 + np.float32(0.3275911) * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = (1 - poly * np.exp(-z * z)) * np.sign(x)
    out: F32 = (0.5 * x * (1 + erf)).astype(np.float32, copy=False)
    return out


def load(path: str) -> BertEncoder | None:
    """The encoder of the sentence-transformers model in ``path``, or None if it is not a plain BERT one."""
    folder = Path(path)
    try:
        modules = [m["type"] for m in json.loads((folder / "modules.json").read_text())]
        config = json.loads((folder / "config.json").read_text())
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        settings = json.loads((folder / "sentence_bert_config.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    plain = (
        modules == _MODULES
        and config.get("model_type") == "bert"
        and config.get("hidden_act") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and pooling.get("pooling_mode_mean_tokens") is True
        and not any(
            v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
        )
        and (folder / "model.safetensors").is_file()
        and (folder / "tokenizer.json").is_file()
    )
    if not plain:
        return None
    try:
        return BertEncoder(folder, config, int(settings.get("max_seq_length", 512)))
    except ImportError:  # tokenizers or safetensors missing: sentence-transformers says what to install
        return None
