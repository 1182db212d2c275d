"""The record of a built context that the runtime stores with each model step.

The CLI and the console read it back to show the exact context of every model call.
"""

from __future__ import annotations

from typing import Any

from statekeep.context.builder import BuiltContext

_SECTIONS = ("system", "pinned", "memories", "summary")


def context_record(built: BuiltContext, *, memory_k: int | None = None) -> dict[str, Any]:
    """What a model call was sent, as the builder produced it: its sections, their tokens and messages.

    The runtime stores this with each model step, so the console shows the exact
    context of every call.
    """
    report = built.report
    present = [name for name in _SECTIONS if getattr(report, name) > 0]
    messages = [m.to_json() for m in built.messages]
    sections = [
        {"name": name, "tokens": getattr(report, name), "messages": [messages[i]]}
        for i, name in enumerate(present)
    ]
    sections.append({"name": "window", "tokens": report.window, "messages": messages[len(present) :]})
    record: dict[str, Any] = {
        "budget": report.budget,
        "counter": report.counter,
        "total": report.total,
        "reply_overhead": report.reply_overhead,
        "sections": sections,
        "memories_dropped": report.memories_dropped,
        "summary_dropped": report.summary_dropped,
        "orphans_dropped": report.orphans_dropped,
    }
    if memory_k is not None:
        record["memory_k"] = memory_k
    return record
