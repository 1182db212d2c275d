"""The demo that ``make demo`` runs: a CRM agent that survives a SIGKILL and waits for a manager.

Narrated step by step, on the embedded default (SQLite and LanceDB under
``.statekeep/demo``) or on PostgreSQL (``statekeep demo --database-url ...``):

1. a worker process starts the run and is killed (SIGKILL) while a tool call is in flight;
2. a second worker takes the run over when the lease expires, skips the completed
   steps, settles the cut-short call with its reconciler, and stops at the
   approval gate before the CRM write: the run waits as a row, no process alive;
3. a manager approves with a separate command (``statekeep approvals approve``);
4. a third worker finishes the run: the CRM record is written exactly once;
5. the memory the agent wrote is found by search, with its provenance, then erased.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from statekeep._redact import redact_url
from statekeep.config import Settings
from statekeep.demo import crm
from statekeep.workflow import RunStatus, SQLWorkflowStore

RESEARCH_SECONDS = 4.0
MARKER = ".statekeep-demo"
LEASE_SECONDS = 2.0
#: Seconds of silence after which the demo says what it is waiting for (checked every 0.2 s).
QUIET = 0.8


class _Progress:
    """Prints what the demo waits for whenever a second passes without a line of output."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.last = time.monotonic()
        self.what: str | None = None
        self.since = 0.0
        self._lock = threading.Lock()
        threading.Thread(target=self._tick, daemon=True, name="demo-progress").start()

    def said(self) -> None:
        """A line was printed: the silence starts over."""
        self.last = time.monotonic()

    def waiting(self, what: str | None) -> None:
        """From now on the demo waits for ``what`` (None: for nothing)."""
        with self._lock:
            self.what, self.since = what, time.monotonic()
        self.said()

    def _tick(self) -> None:
        while True:
            time.sleep(0.2)
            with self._lock:
                what, since = self.what, self.since
            now = time.monotonic()
            if what is not None and now - self.last > QUIET:
                self.console.print(f"    [dim]... {what} ({now - since:.0f} s)[/]", highlight=False)
                self.said()


class Demo:
    """One narrated demo run; see the module docstring."""

    def __init__(self, settings: Settings, console: Console) -> None:
        self.console = console
        self.home = settings.home / "demo"
        embedded = settings.database_url.startswith("sqlite")
        if embedded:
            settings = Settings.load(home=self.home, memory_url=str(self.home / "memory"))
        else:
            settings = Settings.load(
                home=self.home, database_url=settings.database_url, memory_url=settings.memory_url
            )
        self.settings = settings
        suffix = uuid.uuid4().hex[:6]
        self.run_id = f"lead-4471-{suffix}"
        #: a fresh owner per demo, so erasing it touches no one else's memories
        self.owner = f"{crm.OWNER}-{suffix}"
        self.workers = 0
        self.progress = _Progress(console)

    # --- the story ----------------------------------------------------------------------------

    def run(self) -> None:
        """Tell the whole story."""
        self._setup()
        self._crash()
        self._resume_to_approval()
        self._approve()
        self._finish()
        self._memory()
        self._account()

    def _setup(self) -> None:
        c = self.console
        c.rule("[bold]statekeep demo: a CRM agent that survives a crash and waits for a manager")
        marker = self.home / MARKER
        if self.settings.database_url.startswith("sqlite") and marker.exists():
            shutil.rmtree(self.home)  # only a folder an earlier demo made and marked
        if self.home.exists() and not marker.exists() and any(self.home.iterdir()):
            raise SystemExit(f"{self.home} exists and was not made by the demo; choose another --home")
        self.home.mkdir(parents=True, exist_ok=True)
        marker.write_text("made by `statekeep demo`; deleted and remade by the next demo\n")
        c.print(
            f"SQL stores: [cyan]{redact_url(self.settings.database_url)}[/]   "
            f"memory: [cyan]{self.settings.memory_url}[/]"
        )
        rt = crm.build_runtime(self.settings)
        rt.start(crm.AGENT, self.run_id, owner=self.owner, task="Qualify lead lead-4471 and update the CRM.")
        rt.close()
        c.print(f"Run [bold]{self.run_id}[/] recorded as pending: a row, no process yet.\n")

    def _crash(self) -> None:
        c = self.console
        c.print("[bold]1. Worker 1 picks the run up.[/] It will be killed while looking the lead up.")
        proc = self._worker(research=RESEARCH_SECONDS)
        self.progress.waiting("worker 1 starting (a new process) and calling the model")
        self._wait(lambda: any(t.tool == "research_lead" for t in self.store.tool_calls(self.run_id)), proc)
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.progress.waiting(None)
        c.print(f"    [red]SIGKILL[/] worker 1 (pid {proc.pid}) in the middle of research_lead.")
        self._journal("What survived the crash")

    def _resume_to_approval(self) -> None:
        c = self.console
        c.print(
            f"\n[bold]2. Worker 2 starts.[/] It takes the run over once worker 1's lease "
            f"({LEASE_SECONDS:.0f} s) expires,"
        )
        c.print(
            "   replays the journal (steps 1-2 return their recorded outputs: no model call is paid twice),"
        )
        c.print("   and finds research_lead started but never completed: its reconciler decides.")
        self.progress.waiting("worker 2: it takes the run over once the lease expires, then exits when idle")
        self._worker(research=0).wait()
        self.progress.waiting(None)
        run = self.store.get(self.run_id)
        pending = self.store.approvals(run_id=self.run_id)
        if run.status != "waiting_for_approval" or not pending:
            raise SystemExit(f"the run should wait for approval, but it is {run.status}: {run.error}")
        approval = pending[0]
        c.print(f"    run status: [yellow]{run.status}[/]; worker 2 has exited: waiting costs nothing.")
        c.print(f"    pending approval [bold]{approval.approval_id}[/] ({approval.reason}):")
        c.print(f"      {approval.action}({_kwargs(approval.args)})", markup=False, highlight=False)
        self.approval_id = approval.approval_id

    def _approve(self) -> None:
        c = self.console
        c.print("\n[bold]3. The manager approves, from a separate command:[/]")
        for args in (
            ["approvals", "list"],
            [
                "approvals",
                "approve",
                self.approval_id,
                "--by",
                "manager@acme.example",
                "--comment",
                "go ahead",
            ],
        ):
            c.print(f"    $ statekeep {' '.join(args)}")
            self.progress.waiting(f"statekeep {args[0]} {args[1]}")
            out = subprocess.run(
                [sys.executable, "-m", "statekeep", *args],
                env=self._env("cli"),
                capture_output=True,
                text=True,
            )
            self.progress.waiting(None)
            for line in (out.stdout + out.stderr).strip().splitlines():
                c.print(f"      {line}", markup=False, highlight=False, soft_wrap=True)
            if out.returncode:
                raise SystemExit(f"statekeep {args[0]} {args[1]} failed")

    def _finish(self) -> None:
        c = self.console
        c.print("\n[bold]4. Worker 3 finishes the run.[/]")
        self.progress.waiting("worker 3 starting and finishing the run")
        self._worker(research=0, idle_exit=1.0).wait()
        self.progress.waiting(None)
        run = self.store.get(self.run_id)
        writes = crm.crm_writes(self.home / "crm.sqlite")
        c.print(f"    run status: [green]{run.status}[/]; answer: {run.output!r}")
        c.print(f"    CRM writes performed: [bold]{writes}[/] (exactly once, after approval)")
        if run.status is not RunStatus.COMPLETED or writes != 1:
            raise SystemExit("the demo did not end as it should")
        self._ledger()

    def _memory(self) -> None:
        c = self.console
        c.print("\n[bold]5. Long-term memory: what the agent learned, with where it came from.[/]")
        self.progress.waiting("opening the memory store and loading the embedding model")
        rt = crm.build_runtime(self.settings)
        try:
            hits = rt.memory.search(self.owner, "How does Ada like to be contacted?", k=3)
            self.progress.waiting(None)
            for hit in hits:
                p = hit.memory.provenance
                c.print(f"    found ({hit.score:.2f}): {hit.memory.content!r}")
                c.print(
                    f"      provenance: {p.source}, session {p.session_id}, "
                    f"run {p.run_id}, event {p.event_id}"
                )
            if not hits:
                raise SystemExit("the memory was not found")
            receipt = rt.memory.forget(self.owner)
            c.print(f"    forget({self.owner!r}) removed {receipt.removed} memory from {receipt.backend}:")
            for where in receipt.locations:
                c.print(f"      - {where}", markup=False, highlight=False)
            for gap in receipt.not_reached:
                c.print(f"      not reached by erasure itself: {gap}", markup=False, highlight=False)
            again = rt.memory.search(self.owner, "How does Ada like to be contacted?", k=3)
            c.print(f"    search after erasure: {len(again)} results")
        finally:
            rt.close()

    def _account(self) -> None:
        c = self.console
        steps, calls = self.store.steps(self.run_id), self.store.tool_calls(self.run_id)
        approvals = self.store.approvals(status=None, run_id=self.run_id)
        table = Table("what", "where", "saved", title="What was saved where")
        db = redact_url(self.settings.database_url)
        rt = crm.build_runtime(self.settings)
        try:
            events = rt.context.last_seq(self.run_id)
            versions = len(rt.working.versions(self.run_id))
        finally:
            rt.close()
        table.add_row("context", db, f"{events} events of session {self.run_id}")
        table.add_row("working state", db, f"{versions} immutable versions of AgentState")
        table.add_row(
            "workflow",
            db,
            f"{len(steps)} journal entries, {len(calls)} ledger calls, {len(approvals)} approval",
        )
        table.add_row(
            "long-term memory", self.settings.memory_url, "1 memory written, then erased on request"
        )
        table.add_row("the CRM (outside statekeep)", str(self.home / "crm.sqlite"), "1 record, written once")
        c.print()
        c.print(table)

    # --- helpers ------------------------------------------------------------------------------

    @property
    def store(self) -> SQLWorkflowStore:
        if not hasattr(self, "_store"):
            from statekeep.keys import open_key_ring

            url = self.settings.url_for("workflow")
            self._store = SQLWorkflowStore(url, keys=open_key_ring(self.settings))
        return self._store

    def _env(self, who: str, research: float = 0.0) -> dict[str, str]:
        src = str(Path(__file__).resolve().parents[2])
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
            "STATEKEEP_HOME": str(self.home),
            "STATEKEEP_DATABASE_URL": self.settings.database_url,
            "STATEKEEP_MEMORY_URL": self.settings.memory_url,
            "STATEKEEP_DEMO_HOME": str(self.home),
            "STATEKEEP_DEMO_WORKER": who,
            "STATEKEEP_DEMO_RESEARCH_SECONDS": str(research),
            "STATEKEEP_DEMO_LEASE": str(LEASE_SECONDS),
            "HF_HUB_OFFLINE": "1",
            "COLUMNS": str(max(80, self.console.width - 6)),
        }

    def _worker(self, research: float, idle_exit: float = LEASE_SECONDS + 2) -> subprocess.Popen[str]:
        """A worker process; it exits after ``idle_exit`` seconds without a runnable run
        (worker 2 must outlast the lease of the worker killed before it)."""
        self.workers += 1
        who = f"worker {self.workers}"
        cmd = [sys.executable, "-m", "statekeep", "worker", "--app", "statekeep.demo.crm:build_runtime"]
        cmd += ["--idle-exit", str(idle_exit), "--poll", "0.1", "--max-poll", "0.5"]
        proc = subprocess.Popen(
            cmd, env=self._env(who, research), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._relay, args=(proc.stdout,), daemon=True).start()
        return proc

    def _relay(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            if line.startswith("    ["):
                self.console.print(line.rstrip(), markup=False, highlight=False)
                self.progress.said()

    def _wait(self, done: Any, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if proc.poll() is not None:
                raise SystemExit("worker 1 ended before the crash point")
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("worker 1 did not reach the crash point in time")
            time.sleep(0.05)

    def _journal(self, title: str) -> None:
        table = Table("seq", "kind", "name", "state version", "context cursor", title=title)
        for s in self.store.steps(self.run_id):
            table.add_row(str(s.seq), s.kind, s.name, str(s.state_version), str(s.cursor))
        for t in self.store.tool_calls(self.run_id):
            if t.status != "completed":
                table.add_row(str(t.seq), f"tool ({t.status})", t.tool, "-", "-", style="yellow")
        self.console.print(table)
        self.console.print(
            "    yellow: a tool call recorded as started, never completed: ambiguous, never re-run blindly."
        )

    def _ledger(self) -> None:
        table = Table("seq", "tool", "idempotency key", "status", title="The tool-call ledger")
        for t in self.store.tool_calls(self.run_id):
            table.add_row(str(t.seq), t.tool, t.key, t.status)
        self.console.print(table)


def run(settings: Settings | None = None, console: Console | None = None) -> None:
    """Run the narrated demo (see the module docstring)."""
    Demo(settings or Settings.load(), console or Console()).run()


def _kwargs(args: dict[str, Any]) -> str:
    parts = [repr(a) for a in args.get("args", [])]
    parts += [f"{k}={v!r}" for k, v in args.get("kwargs", {}).items()]
    return ", ".join(parts)


__all__ = ["Demo", "run"]
