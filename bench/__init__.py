"""Benchmarks W1-W3: workflow (per-step overhead, resume), context (build time), memory (search, writes).

Run all with ``make bench`` (``python -m bench``), or one with ``python -m bench.<name>``.
Each prints medians and ratios against a baseline measured in the same run, and
writes ``bench/results/<name>.json``.
"""
