"""LangGraph's checkpointer conformance suite (langgraph-checkpoint-conformance) on both backends.

All base capabilities and the three optional ones (prune, copy_thread,
delete_for_runs) must be detected and pass; nothing is skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("langgraph.checkpoint.conformance", reason="the dev extra installs it")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from statekeep.integrations.langgraph import StatekeepSaver

BASE_TESTS = 58
EXTENDED = {"prune": 8, "copy_thread": 8, "delete_for_runs": 7}


def test_conformance(database_url: str) -> None:
    @checkpointer_test(name=f"StatekeepSaver[{database_url.split(':')[0]}]")
    async def saver() -> AsyncIterator[StatekeepSaver]:
        s = StatekeepSaver(database_url)
        yield s
        s.close()

    report = asyncio.run(validate(saver))
    report.print_report()
    results = report.results
    failures = {cap: r.failures for cap, r in results.items() if r.failures}
    assert failures == {}, "\n".join(f for fs in failures.values() for f in fs)
    assert {cap for cap, r in results.items() if r.detected} == {c.value for c in ALL_CAPABILITIES}
    base = sum(r.tests_passed for cap, r in results.items() if cap not in EXTENDED)
    assert base == BASE_TESTS
    assert {cap: results[cap].tests_passed for cap in EXTENDED} == EXTENDED
