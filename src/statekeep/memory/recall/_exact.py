"""Exact nearest neighbours over a matrix of one owner's vectors, shared by the in-process searches.

Scores are cosines (stored vectors and queries are unit length). Two memories
with the same vector must score exactly alike, so that :func:`._ranking.rank_key`
decides their tie: a BLAS product may sum a row differently by its position,
so it only picks the candidates (everything within a hair of the k-th), and
the candidates are scored again row by row in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from statekeep.memory._types import Memory, SearchResult
from statekeep.memory.embedders import Vectors
from statekeep.memory.recall._ranking import rank_key

#: Far wider than the rounding of a float32 dot product of unit vectors (about 1e-6).
_MARGIN = 1e-4


def nearest(
    memories: Sequence[Memory],
    matrix: Vectors,
    vector: Vectors,
    k: int,
    mask: npt.NDArray[np.bool_] | None = None,
) -> list[SearchResult]:
    """The ``k`` best of ``memories`` (rows of ``matrix``) by :func:`.rank_key`; ``mask`` keeps rows."""
    if not len(memories):
        return []
    # einsum's own loop, not BLAS: a threaded BLAS waits for a second core that a busy machine
    # hands out late (tens of milliseconds), while one core does this in well under one
    approx = np.einsum("ij,j->i", matrix, vector.astype(np.float32, copy=False))
    if mask is not None:
        approx = np.where(mask, approx, -np.inf)
    alive = int(np.count_nonzero(approx > -np.inf)) if mask is not None else len(approx)
    if not alive:
        return []
    if alive > k:
        cut = np.partition(approx, len(approx) - k)[len(approx) - k]
        candidates = np.flatnonzero(approx >= cut - _MARGIN)
    else:
        candidates = np.flatnonzero(approx > -np.inf)
    sims = (matrix[candidates] * vector).sum(axis=1, dtype=np.float64)
    if len(candidates) > k:  # the k best and every row tied with the k-th; rank_key orders them
        exact_cut = np.partition(sims, len(sims) - k)[len(sims) - k]
        keep = np.flatnonzero(sims >= exact_cut)
    else:
        keep = np.arange(len(candidates))
    hits = [SearchResult(memories[int(candidates[i])], float(sims[i])) for i in keep]
    return sorted(hits, key=rank_key)[:k]
