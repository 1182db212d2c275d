"""The OpenAI Agents SDK on statekeep: :class:`StatekeepSession`, a ``Session`` over the context log.

Needs ``pip install 'statekeep[agents]'``.
"""

from statekeep.integrations.agents.session import StatekeepSession

__all__ = ["StatekeepSession"]
