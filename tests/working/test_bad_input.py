"""Bad input to the working-state stores: InvalidInputError naming the field, on every backend.

load(run, None) raised AttributeError, huge versions overflowed, and SQLite took
version="1" as 1 while the in-memory store refused it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from statekeep.errors import InvalidInputError
from statekeep.working import StateMigrations, WorkingStateStore

from .conftest import StoreFactory


class Note(BaseModel):
    text: str


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.load("r1", None), "model"),
        (lambda s: s.load("r1", 5), "model"),
        (lambda s: s.load("r1", "Note"), "model"),
        (lambda s: s.load("r1", Note(text="an instance, not the class")), "model"),
        (lambda s: s.get("r1", version=10**30), "version"),
        (lambda s: s.get("r1", version="1"), "version"),
        (lambda s: s.get("r1", version=True), "version"),
        (lambda s: s.get("r1", version=0), "version"),
        (lambda s: s.prune("r1", keep=10**30), "keep"),
        (lambda s: s.save("r1", Note(text="b"), expected_version=10**30), "expected_version"),
    ],
)
def test_bad_arguments_are_refused(
    make_store: StoreFactory, call: Callable[[WorkingStateStore], Any], field: str
) -> None:
    store = make_store()
    store.save("r1", Note(text="a"))
    with pytest.raises(InvalidInputError) as err:
        call(store)
    assert err.value.field == field
    assert store.latest_version("r1") == 1


def test_a_migration_must_name_its_schema_and_version() -> None:
    migrations = StateMigrations()
    with pytest.raises(InvalidInputError) as err:
        migrations.register(5, 1)  # type: ignore[arg-type]
    assert err.value.field == "schema"
    with pytest.raises(InvalidInputError) as err:
        migrations.register("note", 0)
    assert err.value.field == "from_version"
    with pytest.raises(InvalidInputError) as err:
        migrations.register("note", 1)("not a function")  # type: ignore[arg-type]
    assert err.value.field == "fn"
