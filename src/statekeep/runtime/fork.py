"""What a fork copies besides the journal: the session's log up to the cursor, and the working state.

Both copies keep their numbers (event seqs, state versions), so that the copied
journal's cursors and versions mean the same in the new run. Both are idempotent:
a fork interrupted by a crash is completed by forking again.
"""

from __future__ import annotations

from dataclasses import replace

from statekeep._check import check_int
from statekeep.context import ContextStore
from statekeep.errors import AgentError, InvalidInputError, RunConflictError, StateNotFoundError
from statekeep.runtime.agent import AgentState, check_words
from statekeep.workflow import Engine, Run
from statekeep.workflow._types import MAX_SEQ
from statekeep.working import WorkingStateStore


def copy_session(
    context: ContextStore, source: str, target: str, upto: int, rename: tuple[str, str], owner: str
) -> None:
    """Copy events ``1..upto`` of ``source`` into the empty session ``target`` of ``owner``, keys renamed.

    Raises:
        RunConflictError: ``target`` already holds other events.
        SessionOwnerError: either session belongs to another owner.
        AgentError: retention pruned events of ``source`` that the copy needs.
    """
    context.claim(target, owner)
    if upto == 0:
        return
    have = context.last_seq(target)
    if have == upto and context.events(target, after=upto - 1)[0].key == _renamed(
        context.events(source, after=upto - 1, upto=upto)[0].key, rename
    ):
        return  # copied by an earlier, interrupted fork
    if have:
        raise RunConflictError(
            target, f"session {target!r} already has {have} events: fork into another session"
        )
    events = context.events(source, upto=upto, owner=owner)
    if [e.seq for e in events] != list(range(1, upto + 1)):
        raise AgentError(f"session {source!r} was pruned: its events up to {upto} cannot be copied")
    context.copy_events(target, [replace(e, key=_renamed(e.key, rename)) for e in events], owner=owner)


def copy_states(states: WorkingStateStore, source: str, target: str, upto: int, session_id: str) -> None:
    """Copy working-state versions ``1..upto`` of ``source`` to ``target``, pointing at ``session_id``.

    A version retention pruned is filled with version ``upto`` (the copied journal never reads it).
    """
    have = states.latest_version(target)
    if have > upto:
        raise RunConflictError(target, f"already has {have} working-state versions")
    for version in range(have + 1, upto + 1):
        try:
            state = states.load(source, AgentState, version=version)
        except StateNotFoundError:
            state = states.load(source, AgentState, version=upto)
        copied = state.model_copy(update={"session_id": session_id})
        states.save(target, copied, expected_version=version - 1, owner=state.owner)  # sealed as the source


def _renamed(key: str | None, rename: tuple[str, str]) -> str | None:
    old, new = rename
    return new + key[len(old) :] if key is not None and key.startswith(old) else key


def fork_run(
    engine: Engine,
    context: ContextStore,
    working: WorkingStateStore,
    run_id: str,
    at_step: int,
    new_id: str,
    session_id: str | None,
) -> Run:
    """:meth:`Runtime.fork <statekeep.runtime.Runtime.fork>`: copy the session and states, then the run."""
    check_words(new_id, "new_id")
    check_int(at_step, "at_step", maximum=MAX_SEQ)
    if session_id is not None:
        check_words(session_id, "session_id")
    source = engine.store.get(run_id)
    if not source.workflow.startswith("agent.") or len(source.input.get("args", [])) != 3:
        raise InvalidInputError(f"run {run_id!r} is not an agent run", field="run_id")
    owner, session, task = source.input["args"]
    wanted = {"run_id": run_id, "seq": at_step}
    existing = engine.store.find(new_id)
    if existing is not None:
        if existing.input.get("forked_from") == wanted:
            return existing
        raise RunConflictError(new_id, "is taken by another run")
    if at_step > source.last_seq:
        raise InvalidInputError(
            f"run {run_id!r} has {source.last_seq} completed steps: cannot fork at step {at_step}",
            field="at_step",
        )
    journal = engine.store.journal(run_id, 1, at_step) if at_step else []
    version = max((s.state_version for s in journal if s.state_version is not None), default=0)
    cursor = max((s.cursor for s in journal if s.cursor is not None), default=0)
    target = session_id or new_id
    copy_session(context, session, target, cursor, (f"{run_id}/", f"{new_id}/"), owner)
    copy_states(working, run_id, new_id, version, target)
    return engine.fork(run_id, new_id, at_step, args=[owner, target, task])
