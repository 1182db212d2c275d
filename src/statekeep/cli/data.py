"""Commands for what agents know: long-term memory and session context."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from statekeep._literal import visible
from statekeep._open import open_memory, open_sql
from statekeep.errors import InvalidInputError

if TYPE_CHECKING:
    pass
from statekeep.cli._common import (
    DatabaseURL,
    EmbedderOption,
    Home,
    JSONOut,
    MemoryURL,
    Owner,
    console,
    context_app,
    keep_whole,
    literal,
    load_agent,
    load_embedder,
    load_settings,
    memory_app,
    memory_store_for,
    opened,
    print_json_text,
    record_audit,
    show_table,
)

# --- memory ----------------------------------------------------------------------------------


@memory_app.command("search")
def memory_search(
    owner: Owner,
    query: Annotated[str, typer.Argument(help="What to look for, in words.", show_default=False)],
    k: Annotated[int, typer.Option(help="How many memories at most.")] = 5,
    hybrid: Annotated[
        bool, typer.Option(help="Vector plus full-text search (the default); --no-hybrid: by meaning alone.")
    ] = True,
    embedder: EmbedderOption = None,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Search an owner's memories by meaning, with provenance (works while a worker writes)."""
    with memory_store_for(database_url, home, memory_url, read_only=True, embedder=embedder) as store:
        hits = store.search(owner, query, k=k, mode="hybrid" if hybrid else "vector")
    record_audit(database_url, home, "read_memories", owner, {"results": len(hits)})
    if json_out:
        doc = [{"score": h.score, **h.memory.as_dict()} for h in hits]
        print_json_text(json.dumps(doc, ensure_ascii=False, indent=2))
        return
    table = Table("score", "memory", "kind", "source", "session", "run", "event", "id")
    keep_whole(table, 7, [h.memory.id for h in hits])
    for h in hits:
        m, p = h.memory, h.memory.provenance
        table.add_row(
            f"{h.score:.3f}",
            *map(literal, (m.content, m.kind, p.source, p.session_id, p.run_id, p.event_id, m.id)),
        )
    table.caption = f"{len(hits)} found"
    show_table(table)


@memory_app.command("list")
def memory_list(
    owner: Owner,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Every memory of an owner, newest first, superseded and duplicates included, with provenance."""
    with memory_store_for(database_url, home, memory_url, read_only=True) as store:
        memories = list(reversed(store.list_memories(owner)))
    record_audit(database_url, home, "read_memories", owner, {"results": len(memories)})
    if json_out:
        print_json_text(json.dumps([m.as_dict() for m in memories], ensure_ascii=False, indent=2))
        return
    table = Table("created", "memory", "kind", "source", "trust", "run", "id", "state")
    keep_whole(table, 6, [m.id for m in memories])
    for m in memories:
        state = "current" if m.is_current else ("superseded" if m.superseded_by else "duplicate")
        table.add_row(
            f"{m.created_at:%Y-%m-%d %H:%M}",
            *map(literal, (m.content, m.kind, m.provenance.source)),
            f"{m.trust:.2f}",
            *map(literal, (m.provenance.run_id, m.id, state)),
        )
    table.caption = f"{len(memories)} memories of {visible(owner)}"
    show_table(table)


@memory_app.command("add")
def memory_add(
    owner: Owner,
    content: Annotated[str, typer.Argument(help="The memory, in words.", show_default=False)],
    kind: Annotated[str, typer.Option(help="semantic, episodic or procedural.")] = "semantic",
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeatable).")] = None,
    source: Annotated[
        str,
        typer.Option(help="Where it came from: user_supplied, agent_inferred, system_verified, imported."),
    ] = "user_supplied",
    embedder: EmbedderOption = None,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Add a memory for an owner."""
    from statekeep.memory import Provenance

    with memory_store_for(database_url, home, memory_url, embedder=embedder) as store:
        m = store.remember(owner, content, kind=kind, tags=tag or (), provenance=Provenance(source))  # type: ignore[arg-type]
    console.print(literal(f"remembered {m.id} for {owner}"))


@memory_app.command("forget")
def memory_forget(
    owner: Owner,
    memory_id: Annotated[str | None, typer.Option("--id", help="Forget only this memory.")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Erase an owner's memories (or one), leaving nothing recoverable; prints the receipt."""
    what = f"memory {memory_id} of {owner!r}" if memory_id else f"ALL memories of {owner!r}"
    if not yes and not typer.confirm(f"Erase {what}?"):
        raise typer.Abort()
    with memory_store_for(database_url, home, memory_url) as store:
        receipt = store.forget_one(owner, memory_id) if memory_id else store.forget(owner)
    record_audit(database_url, home, "forget_memories", owner, {"removed": receipt.removed})
    print_json_text(json.dumps(receipt.as_dict(), ensure_ascii=False, indent=2))


@memory_app.command("export")
def memory_export(
    owner: Owner,
    out: Annotated[
        Path | None,
        typer.Option(help="Write to this new file (readable by you alone) instead of stdout."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the --out file if it exists.")] = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Export an owner's memories as JSON (works while a worker writes)."""
    if out is not None and out.exists() and not force:
        raise InvalidInputError(f"{out} exists: pass --force to replace it", field="--out")
    with memory_store_for(database_url, home, memory_url, read_only=True) as store:
        data = store.export(owner)
    record_audit(database_url, home, "export", owner, {"memories": int(json.loads(data)["count"])})
    if out is None:
        print_json_text(data)
    else:
        write_private(out, data, replace=force)
        console.print(literal(f"wrote {out}"))


def write_private(path: Path, text: str, *, replace: bool) -> None:
    """Write a person's data to a file only its owner can read (0600), never to one that exists
    unless ``replace``: then a new file takes the place of ``path`` whole (a symlink there is
    replaced, not followed; a write that fails leaves what was there)."""
    if replace:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")  # 0600
    else:
        fd, name = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), str(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)  # no half-written copy of the data is left behind
        raise


@memory_app.command("reembed")
def memory_reembed(
    batch_size: Annotated[int, typer.Option(help="Memories embedded per batch.")] = 256,
    sentences: Annotated[
        bool,
        typer.Option(
            "--sentences",
            help="Then embed the sentences of short memories stored without sentence vectors "
            "(by an older statekeep, or inserted with vectors given); whole vectors stay.",
        ),
    ] = False,
    embedder: EmbedderOption = None,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Re-embed every memory stored by another embedding model, in batches."""
    with (
        memory_store_for(database_url, home, memory_url, embedder=embedder) as store,
        Progress(console=console) as progress,
    ):
        task = progress.add_task("re-embedding", total=None)
        n = store.reembed(
            batch_size=batch_size,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
        if sentences:
            split = progress.add_task("embedding sentences", total=None)
            gained = store.embed_sentences(
                batch_size=batch_size,
                progress=lambda done, total: progress.update(split, completed=done, total=total),
            )
    console.print(f"re-embedded {n} memories")
    if sentences:
        console.print(f"embedded the sentences of {gained} memories")


# --- context ---------------------------------------------------------------------------------


@context_app.command("show")
def context_show(
    session: Annotated[str, typer.Argument(help="The session's id (an agent run's id, by default).")],
    agent: Annotated[
        str | None,
        typer.Option(
            help="module:attr of the Agent (or a callable returning it): its system prompt, budget and "
            "number of memories. Default: as the run's last model call was sent."
        ),
    ] = None,
    budget: Annotated[int | None, typer.Option(help="Token budget (overrides the agent's).")] = None,
    system: Annotated[str | None, typer.Option(help="System prompt (overrides the agent's).")] = None,
    memories: Annotated[
        int | None, typer.Option(help="Memories to retrieve (overrides the agent's).")
    ] = None,
    owner: Annotated[
        str | None, typer.Option(help="Refuse unless the session belongs to this owner.")
    ] = None,
    embedder: EmbedderOption = None,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Exactly what the runtime would send the model next: system prompt, pinned task state,
    memories, summary and window, with tokens per section."""
    from statekeep._inspect import next_context
    from statekeep._open import find_sql
    from statekeep.context import SQLContextStore
    from statekeep.errors import SessionOwnerError
    from statekeep.keys import open_key_ring
    from statekeep.workflow import SQLWorkflowStore
    from statekeep.working import SQLWorkingStateStore

    settings = load_settings(database_url, home, memory_url)
    context_db = opened(open_sql(settings, "context"))
    workflow_db, working_db = find_sql(settings, "workflow"), find_sql(settings, "working")
    keys = None if workflow_db is None else open_key_ring(settings, workflow_db)
    context = SQLContextStore(context_db, keys=keys)
    found_owner = context.owner_of(session)
    if owner is not None and found_owner not in (None, owner):
        raise SessionOwnerError(session, owner, found_owner)
    chosen = None if embedder is None else load_embedder(embedder)
    built = next_context(
        session_id=session,
        context=context,
        workflow=None if workflow_db is None else SQLWorkflowStore(opened(workflow_db), keys=keys),
        working=None if working_db is None else SQLWorkingStateStore(opened(working_db), keys=keys),
        memory=lambda: open_memory(settings, chosen, read_only=True),
        agent=None if agent is None else load_agent(agent),
        system=system,
        budget=budget,
        memory_k=memories,
    )
    record = built.record
    record_audit(database_url, home, "read_context", session, {"owner": built.owner})
    if json_out:
        doc = {
            "session_id": session,
            "owner": built.owner,
            "run_id": None if built.run is None else built.run.run_id,
            "settings_from": built.source,
            "notes": built.notes,
            **record,
        }
        print_json_text(json.dumps(doc, ensure_ascii=False, indent=2))
        return
    run = "-" if built.run is None else f"{built.run.run_id} ({built.run.status.value})"
    console.print(literal(f"session: {session}"))
    console.print(literal(f"owner: {built.owner or '- (none recorded)'}"))
    console.print(literal(f"run: {run}"))
    console.print(literal(f"agent settings from {built.source}"))
    for note in built.notes:
        console.print(literal(f"note: {note}"))
    title = f"{record['total']} of {record['budget']} tokens ({record['counter']}), next model call"
    table = Table("section", "tokens", "messages", title=literal(title))
    sections = {s["name"]: s for s in record["sections"]}
    for name in ("system", "pinned", "memories", "summary", "window"):
        s = sections.get(name, {"tokens": 0, "messages": []})
        table.add_row(name, str(s["tokens"]), str(len(s["messages"])))
    table.add_row("reply overhead", str(record["reply_overhead"]), "")
    console.print(table)
    for s in record["sections"]:
        console.rule(literal(f"{s['name']} ({s['tokens']} tokens)"), align="left")
        for message in s["messages"]:
            console.print(
                Text.assemble((visible(message["role"]), "bold"), ": ", literal(message["content"]))
            )
            for call in message.get("tool_calls") or ():
                arguments = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
                console.print(literal(f"  -> {call['name']}({arguments}) [{call['id']}]"))
