"""Every Python sample in the README and docs/ runs, top to bottom, one namespace per file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def samples(page: Path) -> list[str]:
    return FENCE.findall(page.read_text())


@pytest.mark.parametrize("page", [p for p in PAGES if samples(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_code_samples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each page's samples execute in order in a fresh folder without raising."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STATEKEEP_HOME", str(tmp_path / ".statekeep"))
    namespace: dict[str, object] = {"__name__": f"doc_{page.stem}"}
    for i, code in enumerate(samples(page)):
        try:
            exec(compile(code, f"{page.name}[{i}]", "exec"), namespace)
        except Exception as exc:
            pytest.fail(f"{page.name} sample {i} raised {exc!r}:\n{code}")
    assert os.getcwd() == str(tmp_path)
