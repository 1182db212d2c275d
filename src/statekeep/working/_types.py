"""Records of the working-state store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class StateVersion:
    """One immutable version of a run's working state, as stored.

    ``state`` is the JSON text of the model; it is decoded only through the
    model class (never pickle, never ``eval``).
    """

    run_id: str
    version: int
    schema_name: str
    schema_version: int
    state: str
    created_at: datetime

    @property
    def size(self) -> int:
        """Bytes of JSON this version stores."""
        return len(self.state.encode())
