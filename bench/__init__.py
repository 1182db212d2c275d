"""Benchmarks: run one with ``python -m bench.<name>`` from the repository root (PYTHONPATH=src)."""
