"""The demo's CRM agent: research a lead, draft a CRM update, ask a manager, write it once.

Everything here is deterministic and offline: a scripted model, a "web" of
canned lead profiles, and a CRM that is a SQLite file of its own (outside the
stores under test), which counts every physical write.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statekeep.models import Message, ModelResponse, ScriptedModel, ToolCall
from statekeep.runtime import Agent, AgentTool, Runtime, current_scope
from statekeep.workflow import LedgerEntry, Reconciliation

OWNER = "acme-sales"
LEADS = {
    "lead-4471": {
        "name": "Ada Lovelace",
        "company": "Analytical Engines Ltd",
        "role": "Head of Computing",
        "interest": "automating difference tables for navigation",
        "preference": "prefers email over phone calls, mornings only",
    }
}


def home() -> Path:
    """The demo's folder (the CRM file lives there)."""
    return Path(os.environ.get("STATEKEEP_DEMO_HOME", ".statekeep/demo"))


def _say(text: str) -> None:
    who = os.environ.get("STATEKEEP_DEMO_WORKER", "")
    print(f"    [{who}] {text}" if who else f"    {text}", flush=True)


# --- the CRM: a separate SQLite file, with an idempotency key per write -------------------


def crm(path: Path | None = None) -> sqlite3.Connection:
    """Open the demo CRM (creating its two tables)."""
    conn = sqlite3.connect(path or home() / "crm.sqlite", isolation_level=None)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS records (lead_id TEXT PRIMARY KEY, fields TEXT, idem_key TEXT UNIQUE)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS write_log (idem_key TEXT, at REAL)")
    return conn


def crm_writes(path: Path | None = None) -> int:
    """How many times the CRM was physically written."""
    conn = crm(path)
    try:
        return int(conn.execute("SELECT count(*) FROM write_log").fetchone()[0])
    finally:
        conn.close()


# --- tools ---------------------------------------------------------------------------------


def research_lead(key: str, lead_id: str) -> dict[str, Any]:
    """Look a lead up (slow, read-only)."""
    _say(f"research_lead({lead_id!r}) running: looking the lead up ...")
    time.sleep(float(os.environ.get("STATEKEEP_DEMO_RESEARCH_SECONDS", "0")))
    profile = LEADS.get(lead_id)
    return {"lead_id": lead_id, "found": profile is not None, **(profile or {})}


def research_reconciler(call: LedgerEntry) -> Reconciliation:
    """Research only reads: if a crash cut it short, it is safe to run again."""
    _say(f"reconciler: research call {call.key} was cut short; it only reads, so run it again")
    return Reconciliation(happened=False)


def remember_lead(key: str, fact: str) -> dict[str, Any]:
    """Keep a fact about the lead in long-term memory (provenance comes from the run)."""
    memory = _runtime().remember(fact, kind="semantic", tags=["lead"], metadata={"idempotency_key": key})
    _say(f"remember_lead: memory {memory.id[:8]} written with provenance {memory.provenance.as_dict()}")
    return {"memory_id": memory.id}


def draft_crm_update(key: str, lead_id: str, note: str) -> dict[str, Any]:
    """Draft the CRM update (no side effect)."""
    _say(f"draft_crm_update({lead_id!r}) drafted")
    return {"lead_id": lead_id, "fields": {"status": "qualified", "note": note}}


def write_crm(key: str, lead_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Write the CRM record: the consequential action, gated by a manager's approval.

    The record and the idempotency key of the write that made it commit together,
    so the reconciler can always tell whether a write with a given key landed.
    """
    conn = crm()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO write_log VALUES (?, ?)", (key, time.time()))
        conn.execute(
            "INSERT INTO records VALUES (?, ?, ?) ON CONFLICT (lead_id) "
            "DO UPDATE SET fields = excluded.fields, idem_key = excluded.idem_key",
            (lead_id, json.dumps(fields), key),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    _say(f"write_crm({lead_id!r}) WROTE the CRM record (idempotency key {key})")
    return {"written": True, "lead_id": lead_id}


def crm_reconciler(call: LedgerEntry) -> Reconciliation:
    """Ask the CRM whether a write with this idempotency key landed."""
    conn = crm()
    try:
        row = conn.execute("SELECT lead_id FROM records WHERE idem_key = ?", (call.key,)).fetchone()
    finally:
        conn.close()
    return Reconciliation(
        happened=row is not None, result={"written": True, "lead_id": row[0]} if row else None
    )


# --- the scripted model --------------------------------------------------------------------


def script(messages: Sequence[Message]) -> ModelResponse:
    """Decide the next move from the tool results already in the conversation."""
    done = {m.get("name") or _tool_name(messages, m) for m in messages if m.get("role") == "tool"}
    lead = "lead-4471"
    if "research_lead" not in done:
        return _calls(("research_lead", {"lead_id": lead}))
    if "draft_crm_update" not in done:
        profile = LEADS[lead]
        fact = f"{profile['name']} ({profile['company']}) {profile['preference']}."
        note = f"{profile['role']}, interested in {profile['interest']}."
        return _calls(
            ("remember_lead", {"fact": fact}), ("draft_crm_update", {"lead_id": lead, "note": note})
        )
    if "write_crm" not in done:
        fields = {"status": "qualified", "note": "Head of Computing; wants navigation tables automated."}
        return _calls(("write_crm", {"lead_id": lead, "fields": fields}))
    return ModelResponse(content="The CRM record for lead-4471 is updated and the manager approved it.")


def _tool_name(messages: Sequence[Message], result: Message) -> str | None:
    for m in messages:
        for call in m.get("tool_calls") or ():
            if call["id"] == result.get("tool_call_id"):
                return str(call["function"]["name"])
    return None


def _calls(*calls: tuple[str, dict[str, Any]]) -> ModelResponse:
    turn = "-".join(name for name, _ in calls)
    return ModelResponse(
        tool_calls=tuple(ToolCall(f"call-{turn}-{i}", n, a) for i, (n, a) in enumerate(calls))
    )


def model() -> ScriptedModel:
    """The demo's model: a script, narrated when it is actually called (not on replay)."""

    def narrated(messages: Sequence[Message]) -> ModelResponse:
        answer = script(messages)
        asks = ", ".join(c.name for c in answer.tool_calls) or "final answer"
        _say(f"model called ({len(messages)} messages in context) -> {asks}")
        return answer

    return ScriptedModel(narrated, name="demo-script")


# --- the agent -----------------------------------------------------------------------------

AGENT = Agent(
    name="crm",
    system="You qualify sales leads and keep the CRM up to date. Never write to the CRM without approval.",
    tools=[
        AgentTool("research_lead", research_lead, "Look a lead up.", reconciler=research_reconciler),
        AgentTool("remember_lead", remember_lead, "Remember a fact about the lead."),
        AgentTool("draft_crm_update", draft_crm_update, "Draft a CRM update."),
        AgentTool(
            "write_crm",
            write_crm,
            "Write the CRM record.",
            approval="writes a customer record in the CRM",
            reconciler=crm_reconciler,
        ),
    ],
)

_RUNTIME: list[Runtime] = []


def register(runtime: Runtime) -> None:
    """Register the CRM agent on a runtime."""
    _RUNTIME[:] = [runtime]
    runtime.register(AGENT)


def _runtime() -> Runtime:
    if not _RUNTIME:
        raise RuntimeError("the CRM agent is not registered on a runtime")
    if current_scope() is None:
        raise RuntimeError("remember_lead runs only inside a run")
    return _RUNTIME[0]


def build_runtime(settings: Any = None) -> Runtime:
    """The demo's runtime: the configured stores, the scripted model, the CRM agent registered.

    This is the ``--app`` of ``statekeep worker --app statekeep.demo.crm:build_runtime``.
    """
    from statekeep.config import Settings

    runtime = Runtime.open(
        settings or Settings.load(), model=model(), lease=float(os.environ.get("STATEKEEP_DEMO_LEASE", "30"))
    )
    register(runtime)
    return runtime
