"""Recall: how a memory store finds and ranks an owner's memories, written once for every backend.

Full-text ranking (:mod:`._bm25`, with irregular forms read as their base: :mod:`._irregular`),
exact vector ranking (:mod:`._exact`), sentence vectors (:mod:`._sentences`), the periods a
query names (:mod:`._when`) and the order and fusion of the rankings (:mod:`._ranking`).
"""
