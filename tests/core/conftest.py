"""The core-only pass: tests that need nothing but ``pip install statekeep`` and pytest.

``.ci/run`` runs this folder in a fresh virtual environment with only the core
installed (no torch, LanceDB, numpy, PostgreSQL driver or FastAPI); ``make test``
runs it with everything else. So nothing here may import an extra's module or ask
for PostgreSQL. Child processes started by :func:`without_extras` see every
extra's modules as missing, whichever environment runs them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from statekeep._extras import EXTRAS

#: Prepended to a child's code: every module of every extra fails to import there.
BLOCK = "import sys\n" + "".join(
    f"sys.modules[{m!r}] = None\n" for m in sorted(set().union(*EXTRAS.values()))
)


def without_extras(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child Python where no extra is installed; return its result."""
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
