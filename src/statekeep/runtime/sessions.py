"""A context session belongs to one owner: claiming it before a run writes anything."""

from __future__ import annotations

from contextlib import suppress

from statekeep._check import MAX_INT
from statekeep.context import ContextStore
from statekeep.errors import SessionOwnerError
from statekeep.workflow import Run, WorkflowStore


class SessionClaims:
    """Claims sessions for the owners of the runs that use them."""

    def __init__(self, context: ContextStore, runs: WorkflowStore) -> None:
        self.context, self.runs = context, runs
        #: the owner of each session's first agent run, read once, to claim sessions older than owners
        self._first_owners: dict[str, str] | None = None

    def claim(self, session_id: str, owner: str) -> None:
        """Make the session ``owner``'s, or refuse it: a session belongs to one owner.

        A session that predates owners (events, but no owner) is first claimed for
        the owner of its first agent run, so the upgrade hands no one else's
        conversation to whichever owner happens to come first; a session without
        runs goes to this owner.

        Raises:
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        context = self.context
        current = context.owner_of(session_id)
        if current == owner:
            return  # an owner, once recorded, never changes: one read on every later run
        if current is not None:
            raise SessionOwnerError(session_id, owner, current)
        if context.last_seq(session_id) > 0:
            first = self._first_owner(session_id)
            if first is not None:
                with suppress(SessionOwnerError):  # claimed meanwhile: the claim below names that owner
                    context.claim(session_id, first)
        context.claim(session_id, owner)

    def _first_owner(self, session_id: str) -> str | None:
        """The owner of the session's first agent run, from one pass over the runs per runtime.

        Runs started since owners are recorded claim their session when they
        start, so only older runs matter, and they are all there at the first pass.
        """
        if self._first_owners is None:
            owners: dict[str, str] = {}
            for run in self.runs.list_runs(limit=MAX_INT):  # oldest first
                started = agent_input(run)
                if started is not None:
                    owners.setdefault(started[1], started[0])
            self._first_owners = owners
        return self._first_owners.get(session_id)


def agent_input(run: Run) -> tuple[str, str] | None:
    """(owner, session id) of an agent run, from its input; None for another workflow's run."""
    if not run.workflow.startswith("agent."):
        return None
    args = run.input.get("args") if isinstance(run.input, dict) else None
    if not isinstance(args, list) or len(args) != 3 or not all(isinstance(a, str) for a in args[:2]):
        return None
    return args[0], args[1]
