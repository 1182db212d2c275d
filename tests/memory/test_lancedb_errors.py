"""What a LanceDB store raises when Lance fails: StorageError, saying what failed, chained to Lance's error.

The table is real and really damaged (data files deleted or overwritten, versions
gone); only the read-only retries that run out and the disk that fails are
provoked by patching one call. The embedder is the fake one: what is under test
is the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import filelock
import pytest

from statekeep.errors import InvalidInputError, MemoryNotFoundError, StorageError
from statekeep.memory import FakeEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore
from statekeep.memory.lancedb._lock import LOCK_FILE, RETRY_SECONDS

pytest.importorskip("lancedb")


def written(folder: Path) -> LanceDBMemoryStore:
    store = LanceDBMemoryStore(folder, FakeEmbedder())
    store.remember_many("alice", [f"Alice's fact number {i}" for i in range(5)])
    return store


def read_only(folder: Path) -> LanceDBMemoryStore:
    """A read-only store on a folder that a writer, now closed, wrote five memories to."""
    written(folder).close()
    return LanceDBMemoryStore(folder, FakeEmbedder(), read_only=True)


def data_files(folder: Path) -> list[Path]:
    files = sorted((folder / "memories.lance" / "data").iterdir())
    assert files, "no data file: the test proves nothing"
    return files


def assert_storage_error(raised: pytest.ExceptionInfo[StorageError], what: str, folder: Path) -> None:
    """The message says what was being done, where, and the first line of Lance's reason (its cause)."""
    message, start = str(raised.value), f"{what} in the LanceDB memory at {folder}: "
    assert message.startswith(start)
    assert len(message) > len(start)
    assert "\n" not in message
    assert isinstance(raised.value.__cause__, OSError | RuntimeError | ValueError | KeyError)
    assert str(raised.value.__cause__).splitlines()[0].strip() in message


def test_each_operation_on_a_table_whose_data_files_were_deleted_raises_storage_error(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    store = written(folder)
    for f in data_files(folder):
        f.unlink()
    calls: list[tuple[str, Any]] = [
        ("searching memories", lambda: store.search("alice", "fact")),
        ("searching memories", lambda: store.search("alice", "fact", mode="text")),
        ("searching memories", lambda: store.search("alice", "fact", mode="vector", tags="x")),
        ("listing memories", lambda: store.list_memories("alice")),
        ("reading a memory", lambda: store.get("alice", "nope")),
        ("looking up memories", lambda: store.remember("alice", "Alice's new fact")),
        ("erasing memories", lambda: store.forget("alice")),
        ("counting memories to re-embed", lambda: store.reembed()),
    ]
    for what, call in calls:
        with pytest.raises(StorageError) as raised:
            call()
        assert_storage_error(raised, what, folder)
    store.close()


def test_a_table_whose_data_files_are_garbage_raises_storage_error(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    store = written(folder)
    for f in data_files(folder):
        f.write_bytes(b"not a lance file" * 8)
    with pytest.raises(StorageError) as raised:
        store.search("alice", "fact", mode="vector", tags="x")
    assert_storage_error(raised, "searching memories", folder)
    store.close()
    with pytest.raises(StorageError) as read:  # and a read-only store, once its retries run out
        LanceDBMemoryStore(folder, FakeEmbedder(), read_only=True).list_memories("alice")
    assert_storage_error(read, "listing memories", folder)


def test_a_table_that_cannot_be_opened_raises_storage_error_and_frees_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    written(folder).close()
    for f in (folder / "memories.lance" / "_versions").iterdir():
        f.unlink()
    with pytest.raises(StorageError) as raised:
        LanceDBMemoryStore(folder, FakeEmbedder())
    assert_storage_error(raised, "opening the memories table", folder)
    lock = filelock.FileLock(folder / LOCK_FILE, timeout=0)
    lock.acquire()  # the failed store let go of the writer lock
    lock.release()


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (OSError(5, "Input/output error"), "[Errno 5] Input/output error"),
        (ValueError("Invalid: the version's file is gone"), "Invalid: the version's file is gone"),  # Arrow's
    ],
)
def test_a_read_only_store_whose_reads_keep_failing_tries_again_then_raises_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, said: str
) -> None:
    folder = tmp_path / "m"
    reader = read_only(folder)
    monkeypatch.setattr("statekeep.memory.lancedb._lock.RETRY_SECONDS", (0.0,) * len(RETRY_SECONDS))
    tries: list[str] = []

    def failing(self: LanceDBMemoryStore, clause: str, columns: list[str] | None = None) -> Any:
        tries.append(clause)
        raise error

    monkeypatch.setattr(LanceDBMemoryStore, "_rows", failing)
    with pytest.raises(StorageError) as raised:
        reader.list_memories("alice")
    assert len(tries) == len(RETRY_SECONDS) + 1  # every try was made before giving up
    assert_storage_error(raised, "listing memories", folder)
    assert str(raised.value).endswith(said)


def test_a_read_only_store_does_not_retry_its_own_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "m"
    reader = read_only(folder)
    tries: list[str] = []

    def refusing(self: LanceDBMemoryStore, clause: str, columns: list[str] | None = None) -> Any:
        tries.append(clause)
        raise InvalidInputError("is not a memory filter", field="where")

    monkeypatch.setattr(LanceDBMemoryStore, "_rows", refusing)
    with pytest.raises(InvalidInputError):
        reader.list_memories("alice")
    assert len(tries) == 1


def test_a_writer_whose_disk_fails_raises_storage_error_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "m"
    store = written(folder)

    def full(data: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store._table, "add", full)
    with pytest.raises(StorageError) as raised:
        store.remember("alice", "Alice's new fact")
    assert_storage_error(raised, "storing memories", folder)
    monkeypatch.undo()
    assert [m.content for m in store.list_memories("alice")] == [f"Alice's fact number {i}" for i in range(5)]
    store.close()


def test_statekeep_errors_and_interrupts_pass_through_unwrapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "m"
    reader = read_only(folder)
    with pytest.raises(InvalidInputError) as refused:  # a ValueError, raised inside a locked operation
        reader.remember("alice", "Alice's new fact")
    assert refused.value.__cause__ is None
    with pytest.raises(MemoryNotFoundError):
        reader.get("alice", "nope")

    def interrupted(self: LanceDBMemoryStore, clause: str, columns: list[str] | None = None) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(LanceDBMemoryStore, "_rows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reader.list_memories("alice")
