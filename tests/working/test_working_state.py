"""The working-state store: immutable versions, optimistic concurrency, schema migrations."""

from __future__ import annotations

import enum
import threading
from datetime import UTC, datetime
from decimal import Decimal
from typing import ClassVar
from uuid import UUID, uuid4

import pydantic
import pytest

from statekeep.errors import (
    InvalidInputError,
    MigrationError,
    SchemaVersionError,
    StatekeepError,
    StateNotFoundError,
    StateValidationError,
    VersionConflictError,
)
from statekeep.working import StateMigrations, WorkingState, WorkingStateStore

from .conftest import StoreFactory


class Stage(enum.Enum):
    RESEARCH = "research"
    DRAFT = "draft"


class Lead(pydantic.BaseModel):
    name: str
    score: Decimal


class Plan(WorkingState):
    state_schema: ClassVar[str] = "plan"
    state_version: ClassVar[int] = 1
    stage: Stage = Stage.RESEARCH
    steps: list[str] = []
    lead: Lead | None = None
    seen: set[UUID] = set()
    due: datetime | None = None


def test_save_creates_immutable_numbered_versions(store: WorkingStateStore) -> None:
    """Each save is a new version; earlier versions stay readable exactly as saved."""
    v1 = store.save("run-1", Plan(steps=["a"]))
    v2 = store.save("run-1", Plan(steps=["a", "b"], stage=Stage.DRAFT))
    assert (v1.version, v2.version) == (1, 2)
    assert store.load("run-1", Plan).steps == ["a", "b"]
    assert store.load("run-1", Plan, version=1).steps == ["a"]
    assert store.load("run-1", Plan, version=1).stage is Stage.RESEARCH
    record = store.get("run-1")
    assert (record.schema_name, record.schema_version, record.version) == ("plan", 1, 2)
    assert record.created_at.tzinfo is not None


def test_runs_are_independent(store: WorkingStateStore) -> None:
    """Versions are numbered per run."""
    store.save("a", Plan())
    store.save("a", Plan())
    assert store.save("b", Plan()).version == 1
    assert [v.version for v in store.versions("a")] == [1, 2]


def test_stale_expected_version_conflicts_and_writes_nothing(store: WorkingStateStore) -> None:
    """Optimistic concurrency: a save against a stale version raises and stores nothing."""
    store.save("run", Plan(steps=["first"]), expected_version=0)
    store.save("run", Plan(steps=["second"]), expected_version=1)
    with pytest.raises(VersionConflictError) as err:
        store.save("run", Plan(steps=["lost update"]), expected_version=1)
    assert (err.value.expected, err.value.actual) == (1, 2)
    assert store.latest_version("run") == 2
    assert store.load("run", Plan).steps == ["second"]


def test_concurrent_writers_with_same_expectation_one_wins(store: WorkingStateStore) -> None:
    """Of many writers racing from the same version, exactly one succeeds."""
    store.save("race", Plan(), expected_version=0)
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def writer(i: int) -> None:
        barrier.wait()
        try:
            store.save("race", Plan(steps=[str(i)]), expected_version=1)
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


def test_load_missing_raises_not_found(store: WorkingStateStore) -> None:
    """Loading a run or a version that does not exist raises StateNotFoundError."""
    with pytest.raises(StateNotFoundError):
        store.load("nobody", Plan)
    store.save("run", Plan())
    with pytest.raises(StateNotFoundError) as err:
        store.load("run", Plan, version=7)
    assert err.value.version == 7


def test_invalid_state_is_refused_before_writing(store: WorkingStateStore) -> None:
    """A state that fails validation (here built with model_construct) writes nothing."""
    bad = Plan.model_construct(steps="not a list")  # type: ignore[arg-type]
    with pytest.raises(StateValidationError):
        store.save("run", bad)
    assert store.latest_version("run") == 0


def test_non_json_exact_state_is_refused(store: WorkingStateStore) -> None:
    """A float NaN does not survive JSON; the save is refused, nothing written."""

    class Scores(pydantic.BaseModel):
        x: float

    with pytest.raises(StateValidationError):
        store.save("run", Scores(x=float("nan")))
    assert store.versions("run") == []


def test_not_a_model_is_refused(store: WorkingStateStore) -> None:
    """Only pydantic models are stored: no pickle, no arbitrary objects."""
    with pytest.raises(StateValidationError):
        store.save("run", {"a": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("run_id", ["", None, "x" * 256, 42, "a\x00b", "\ud800"])
def test_bad_run_id_is_refused(store: WorkingStateStore, run_id: object) -> None:
    """Run ids are non-empty strings of at most 255 characters that every backend can store."""
    with pytest.raises(InvalidInputError) as err:
        store.save(run_id, Plan())  # type: ignore[arg-type]
    assert err.value.field == "run_id"


def test_odd_run_ids_are_just_strings(store: WorkingStateStore) -> None:
    """Quotes, wildcards and path characters in a run id are stored verbatim."""
    odd = "../%_'\";--*ünï"
    store.save(odd, Plan(steps=["x"]))
    store.save("..", Plan())
    assert store.load(odd, Plan).steps == ["x"]
    assert len(store.versions(odd)) == 1


def test_retention_keeps_last_n(store: WorkingStateStore) -> None:
    """prune(keep=N) deletes older versions of that run only; numbering continues."""
    for i in range(5):
        store.save("run", Plan(steps=[str(i)]))
    store.save("other", Plan())
    assert store.prune("run", keep=2) == 3
    assert [v.version for v in store.versions("run")] == [4, 5]
    assert store.save("run", Plan()).version == 6
    assert len(store.versions("other")) == 1
    with pytest.raises(InvalidInputError):
        store.prune("run", keep=0)


class PlanV1(WorkingState):
    state_schema: ClassVar[str] = "evolving"
    state_version: ClassVar[int] = 1
    title: str


class PlanV3(WorkingState):
    state_schema: ClassVar[str] = "evolving"
    state_version: ClassVar[int] = 3
    heading: str
    tags: list[str]


def _migrations(*steps: int) -> StateMigrations:
    migrations = StateMigrations()
    if 1 in steps:
        migrations.register("evolving", from_version=1)(lambda d: {"heading": d["title"]})
    if 2 in steps:
        migrations.register("evolving", from_version=2)(lambda d: {**d, "tags": ["migrated"]})
    return migrations


def test_old_version_loads_through_migration_chain(make_store: StoreFactory) -> None:
    """State saved at schema v1 loads into v3 code by running 1->2->3; the stored row is unchanged."""
    make_store().save("run", PlanV1(title="call Ada"))
    store = make_store(_migrations(1, 2))
    loaded = store.load("run", PlanV3)
    assert loaded == PlanV3(heading="call Ada", tags=["migrated"])
    assert store.get("run").schema_version == 1


def test_gap_in_migration_chain_raises(make_store: StoreFactory) -> None:
    """A missing step (2->3) is an error naming the version; nothing loads silently."""
    make_store().save("run", PlanV1(title="t"))
    with pytest.raises(MigrationError, match="from version 2"):
        make_store(_migrations(1)).load("run", PlanV3)


def test_newer_stored_version_raises(make_store: StoreFactory) -> None:
    """State written by newer code is refused by older code."""
    store = make_store()
    store.save("run", PlanV3(heading="h", tags=[]))
    with pytest.raises(SchemaVersionError, match="newer"):
        store.load("run", PlanV1)


def test_other_schema_raises(store: WorkingStateStore) -> None:
    """Loading a run's state into a model of another schema is an error."""
    store.save("run", Plan())
    with pytest.raises(SchemaVersionError, match="stores schema 'plan'"):
        store.load("run", PlanV1)


def test_failing_migration_is_reported(make_store: StoreFactory) -> None:
    """A migration that raises becomes a MigrationError; a StatekeepError for callers."""
    make_store().save("run", PlanV1(title="t"))
    migrations = StateMigrations()

    @migrations.register("evolving", from_version=1)
    def _boom(data: dict[str, object]) -> dict[str, object]:
        raise KeyError("heading")

    migrations.register("evolving", from_version=2)(lambda d: d)
    with pytest.raises(StatekeepError, match="migration from 1 failed"):
        make_store(migrations).load("run", PlanV3)


def test_state_survives_a_new_store_instance(make_store: StoreFactory) -> None:
    """What one store instance saved, another (a new process's) loads."""
    uid = uuid4()
    make_store().save("run", Plan(seen={uid}, due=datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC)))
    loaded = make_store().load("run", Plan)
    assert loaded.seen == {uid}
    assert loaded.due == datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC)


def test_delete_removes_every_version_of_the_named_runs_only(store: WorkingStateStore) -> None:
    """delete(*run_ids) is what retention of finished runs calls; other runs keep their versions."""
    for run_id in ("a", "b", "c"):
        store.save(run_id, Plan(steps=[run_id]))
        store.save(run_id, Plan(steps=[run_id, "again"]))
    assert store.delete("a", "b", "a", "never-saved") == 4
    assert store.versions("a") == store.versions("b") == []
    assert store.latest_version("c") == 2
    assert store.delete() == 0
    with pytest.raises(InvalidInputError):
        store.delete("c", "")
    assert store.latest_version("c") == 2
