"""The shared SQL layer: engines, transactions, dialect hooks and migrations.

Every SQL store (context, working state, workflow) is built on :class:`Database`.
Stores never talk to each other through this layer; they only share it.
"""

from statekeep.db.engine import Database
from statekeep.db.migrations import Migration, upgrade

__all__ = ["Database", "Migration", "upgrade"]
