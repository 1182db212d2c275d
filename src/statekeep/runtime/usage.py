"""Token usage of a run: each model step journals its call's usage; a run's is their sum."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from statekeep.workflow import StepRecord


@dataclass(frozen=True)
class Usage:
    """Tokens a run's model calls used: prompt (of which ``cached``), completion, and the number of calls."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    calls: int = 0

    @property
    def total(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt + self.completion

    def __str__(self) -> str:
        return (
            f"{self.prompt} prompt ({self.cached} cached) + {self.completion} completion tokens "
            f"in {self.calls} model call(s)"
        )


def run_usage(steps: Iterable[StepRecord]) -> Usage:
    """The sum of the ``usage`` every journaled step output carries (the runtime's model steps do).

    Examples:
        >>> run_usage([])
        Usage(prompt=0, completion=0, cached=0, calls=0)
    """
    prompt = completion = cached = calls = 0
    for step in steps:
        if step.kind != "step" or '"usage"' not in step.output:
            continue
        value = json.loads(step.output)
        usage = value.get("usage") if isinstance(value, dict) else None
        if not isinstance(usage, dict):
            continue
        prompt += int(usage.get("prompt") or 0)
        completion += int(usage.get("completion") or 0)
        cached += int(usage.get("cached") or 0)
        calls += 1
    return Usage(prompt, completion, cached, calls)
