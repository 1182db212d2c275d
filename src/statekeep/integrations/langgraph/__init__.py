"""LangGraph on statekeep: a checkpointer and a long-term store.

* :class:`StatekeepSaver`: a ``BaseCheckpointSaver`` on SQLite or PostgreSQL, with
  ``prune``, ``copy_thread`` and ``delete_for_runs``; grown lists are stored as deltas.
* :class:`StatekeepStore`: a ``BaseStore`` with vector search over a statekeep memory
  store (LanceDB or pgvector); each namespace belongs to an owner, so erasure and
  row-level security apply to LangGraph's long-term memory too.

Needs ``pip install 'statekeep[langgraph]'``.
"""

from statekeep.integrations.langgraph.saver import StatekeepSaver
from statekeep.integrations.langgraph.store import LangChainEmbedder, StatekeepStore

__all__ = ["LangChainEmbedder", "StatekeepSaver", "StatekeepStore"]
