"""The conformance suite of the working-state contract (:class:`~statekeep.working.WorkingStateStore`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import ClassVar
from uuid import UUID, uuid4

import pydantic
import pytest

from statekeep.errors import (
    MigrationError,
    SchemaVersionError,
    StateNotFoundError,
    StateValidationError,
    VersionConflictError,
)
from statekeep.working import StateMigrations, WorkingState, WorkingStateStore

#: Opens a store over the test's data; each call sees what earlier calls' stores saved.
WorkingStateStoreFactory = Callable[[], WorkingStateStore]


class _Lead(pydantic.BaseModel):
    name: str
    score: Decimal


class _Plan(WorkingState):
    state_schema: ClassVar[str] = "suite.plan"
    state_version: ClassVar[int] = 1
    steps: list[str] = []
    lead: _Lead | None = None
    seen: set[UUID] = set()
    due: datetime | None = None


class _PlanV1(WorkingState):
    state_schema: ClassVar[str] = "suite.evolving"
    state_version: ClassVar[int] = 1
    title: str


class _PlanV3(WorkingState):
    state_schema: ClassVar[str] = "suite.evolving"
    state_version: ClassVar[int] = 3
    heading: str
    tags: list[str]


def _migrations(*steps: int) -> StateMigrations:
    migrations = StateMigrations()
    if 1 in steps:
        migrations.register("suite.evolving", from_version=1)(lambda d: {"heading": d["title"]})
    if 2 in steps:
        migrations.register("suite.evolving", from_version=2)(lambda d: {**d, "tags": ["migrated"]})
    return migrations


def _with(store: WorkingStateStore, migrations: StateMigrations) -> WorkingStateStore:
    """The store, loading with ``migrations`` from now on."""
    store.migrations = migrations
    return store


class WorkingStateStoreSuite:
    """The invariants of a :class:`~statekeep.working.WorkingStateStore` backend.

    Subclass it as ``Test...`` and define the fixture ``make_store``: a function
    ``make_store()`` that returns a store over this test's data (empty at the
    start of each test). Every call within one test must see what stores from
    earlier calls saved, as a second process would. The suite sets a store's
    ``migrations`` itself, where a test needs them.
    """

    @pytest.fixture
    def make_store(self) -> WorkingStateStoreFactory:
        """The backend under test: override this fixture in the subclass."""
        raise NotImplementedError(f"{type(self).__name__} must define a make_store fixture")

    @pytest.fixture
    def store(self, make_store: WorkingStateStoreFactory) -> WorkingStateStore:
        """A store over the test's data."""
        return make_store()

    # --- versions ------------------------------------------------------------------------

    def test_each_save_is_a_new_immutable_version(self, store: WorkingStateStore) -> None:
        """Each save is the next version; earlier versions stay readable exactly as saved."""
        v1 = store.save("run-1", _Plan(steps=["a"]))
        v2 = store.save("run-1", _Plan(steps=["a", "b"], lead=_Lead(name="Ada", score=Decimal("0.10"))))
        assert (v1.version, v2.version) == (1, 2)
        assert store.load("run-1", _Plan).steps == ["a", "b"]
        assert store.load("run-1", _Plan).lead == _Lead(name="Ada", score=Decimal("0.10"))
        assert store.load("run-1", _Plan, version=1) == _Plan(steps=["a"])
        record = store.get("run-1")
        assert (record.run_id, record.schema_name, record.schema_version, record.version) == (
            "run-1",
            "suite.plan",
            1,
            2,
        )
        assert record.created_at.tzinfo is not None
        assert store.get("run-1", version=1) == v1
        assert [v.version for v in store.versions("run-1")] == [1, 2]

    def test_versions_are_numbered_per_run(self, store: WorkingStateStore) -> None:
        """Every run counts its own versions from 1; a run with none has latest version 0."""
        store.save("a", _Plan())
        store.save("a", _Plan())
        assert store.save("b", _Plan()).version == 1
        assert [v.version for v in store.versions("a")] == [1, 2]
        assert store.latest_version("a") == 2
        assert store.latest_version("never-saved") == 0
        assert store.versions("never-saved") == []

    def test_a_missing_run_or_version_is_not_found(self, store: WorkingStateStore) -> None:
        """Loading a run or a version that does not exist raises StateNotFoundError."""
        with pytest.raises(StateNotFoundError):
            store.load("nobody", _Plan)
        store.save("run", _Plan())
        with pytest.raises(StateNotFoundError) as err:
            store.load("run", _Plan, version=7)
        assert err.value.version == 7

    def test_state_survives_a_new_store_instance(self, make_store: WorkingStateStoreFactory) -> None:
        """What one store instance saved, another (a new process's) loads equal."""
        uid = uuid4()
        due = datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
        make_store().save("run", _Plan(seen={uid}, due=due))
        loaded = make_store().load("run", _Plan)
        assert (loaded.seen, loaded.due) == ({uid}, due)

    def test_odd_run_ids_are_just_strings(self, store: WorkingStateStore) -> None:
        """Quotes, wildcards and path characters in a run id are stored verbatim and match nothing else."""
        odd = "../%_'\";--*ünï"
        store.save(odd, _Plan(steps=["x"]))
        store.save("..", _Plan())
        store.save("%", _Plan())
        assert store.load(odd, _Plan).steps == ["x"]
        assert [len(store.versions(r)) for r in (odd, "..", "%", "_")] == [1, 1, 1, 0]

    # --- optimistic concurrency ----------------------------------------------------------

    def test_a_stale_expected_version_conflicts_and_writes_nothing(self, store: WorkingStateStore) -> None:
        """A save against a version that is not the latest raises VersionConflictError; nothing is stored."""
        store.save("run", _Plan(steps=["first"]), expected_version=0)
        store.save("run", _Plan(steps=["second"]), expected_version=1)
        with pytest.raises(VersionConflictError) as err:
            store.save("run", _Plan(steps=["lost update"]), expected_version=1)
        assert (err.value.expected, err.value.actual) == (1, 2)
        with pytest.raises(VersionConflictError):
            store.save("run", _Plan(steps=["lost update"]), expected_version=0)
        with pytest.raises(VersionConflictError):
            store.save("fresh", _Plan(), expected_version=1)
        assert store.latest_version("run") == 2
        assert store.load("run", _Plan).steps == ["second"]
        assert store.versions("fresh") == []

    def test_of_concurrent_writers_from_one_version_exactly_one_wins(self, store: WorkingStateStore) -> None:
        """Threads saving against the same expected version: one succeeds, every other one conflicts."""
        store.save("race", _Plan(), expected_version=0)
        outcomes: list[str] = []
        barrier = threading.Barrier(4)

        def writer(i: int) -> None:
            barrier.wait()
            try:
                store.save("race", _Plan(steps=[str(i)]), expected_version=1)
                outcomes.append("ok")
            except VersionConflictError:
                outcomes.append("conflict")

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["conflict", "conflict", "conflict", "ok"]
        assert store.latest_version("race") == 2

    def test_an_invalid_state_is_refused_before_anything_is_written(self, store: WorkingStateStore) -> None:
        """A state failing validation or a JSON round trip raises StateValidationError; no version."""

        class Scores(pydantic.BaseModel):
            x: float

        with pytest.raises(StateValidationError):
            store.save("run", _Plan.model_construct(steps="not a list"))  # type: ignore[arg-type]
        with pytest.raises(StateValidationError):
            store.save("run", Scores(x=float("nan")))
        assert store.latest_version("run") == 0
        assert store.versions("run") == []

    # --- schema versions and migrations --------------------------------------------------

    def test_an_old_schema_loads_through_the_migration_chain(
        self, make_store: WorkingStateStoreFactory
    ) -> None:
        """State saved at schema v1 loads into v3 code by running 1->2->3; the stored version is unchanged."""
        make_store().save("run", _PlanV1(title="call Ada"))
        store = _with(make_store(), _migrations(1, 2))
        assert store.load("run", _PlanV3) == _PlanV3(heading="call Ada", tags=["migrated"])
        assert store.get("run").schema_version == 1

    def test_a_gap_in_the_migration_chain_refuses_to_load(self, make_store: WorkingStateStoreFactory) -> None:
        """A missing migration step raises MigrationError naming the version; nothing loads silently."""
        make_store().save("run", _PlanV1(title="t"))
        with pytest.raises(MigrationError, match="from version 2"):
            _with(make_store(), _migrations(1)).load("run", _PlanV3)

    def test_a_failing_migration_is_a_migration_error(self, make_store: WorkingStateStoreFactory) -> None:
        """A migration that raises becomes a MigrationError saying which step failed."""
        make_store().save("run", _PlanV1(title="t"))
        migrations = StateMigrations()

        @migrations.register("suite.evolving", from_version=1)
        def _boom(data: dict[str, object]) -> dict[str, object]:
            raise KeyError("heading")

        migrations.register("suite.evolving", from_version=2)(lambda d: d)
        with pytest.raises(MigrationError, match="migration from 1 failed"):
            _with(make_store(), migrations).load("run", _PlanV3)

    def test_state_written_by_newer_code_or_another_schema_is_refused(self, store: WorkingStateStore) -> None:
        """Older code refuses a newer schema version, and no model loads another schema's state."""
        store.save("newer", _PlanV3(heading="h", tags=[]))
        with pytest.raises(SchemaVersionError, match="newer"):
            store.load("newer", _PlanV1)
        store.save("plan", _Plan())
        with pytest.raises(SchemaVersionError, match=r"stores schema 'suite\.plan'"):
            store.load("plan", _PlanV1)

    # --- retention -----------------------------------------------------------------------

    def test_prune_keeps_the_last_versions_and_numbering_continues(self, store: WorkingStateStore) -> None:
        """prune(keep=N) deletes the older versions of that run only; a version number is never reused."""
        for i in range(5):
            store.save("run", _Plan(steps=[str(i)]))
        store.save("other", _Plan())
        assert store.prune("run", keep=2) == 3
        assert [v.version for v in store.versions("run")] == [4, 5]
        assert store.load("run", _Plan).steps == ["4"]
        with pytest.raises(StateNotFoundError):
            store.get("run", version=1)
        assert store.prune("run", keep=2) == 0
        assert store.save("run", _Plan()).version == 6
        assert store.save("run", _Plan(), expected_version=6).version == 7
        assert len(store.versions("other")) == 1
        assert store.prune("never-saved", keep=1) == 0

    def test_delete_removes_every_version_of_the_named_runs_only(self, store: WorkingStateStore) -> None:
        """delete(*run_ids) removes all versions of those runs and counts them; other runs keep theirs."""
        for run_id in ("a", "b", "c"):
            store.save(run_id, _Plan(steps=[run_id]))
            store.save(run_id, _Plan(steps=[run_id, "again"]))
        assert store.delete("a", "b", "a", "never-saved") == 4
        assert store.versions("a") == store.versions("b") == []
        assert store.latest_version("a") == 0
        assert store.latest_version("c") == 2
        assert store.delete() == 0
        store.save("a", _Plan(), expected_version=0)  # the run has no state again
