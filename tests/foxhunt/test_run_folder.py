"""Run folders: unique names even for runs started together, a given folder only when new or empty."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from foxhunt import run_folder
from foxhunt.run_folder import (
    CLAIM_FILE,
    claim_run_folder,
    lock_run_folder,
    new_run_folder,
    unique_run_folder,
)


def _make_folders(root: str, count: int) -> list[str]:
    return [str(unique_run_folder(root)) for _ in range(count)]


def test_runs_started_together_in_parallel_processes_get_distinct_folders(tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_make_folders, [(str(tmp_path), 10)] * 4)
    folders = [folder for result in results for folder in result]
    assert len(folders) == 40 and len(set(folders)) == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(f).name for f in folders)


def test_a_name_already_taken_is_retried_with_another_suffix(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    suffixes = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    monkeypatch.setattr(run_folder.secrets, "token_hex", lambda n: next(suffixes))
    monkeypatch.setattr(run_folder.time, "strftime", lambda fmt: "20260101-000000")
    assert unique_run_folder(tmp_path).name == "20260101-000000-aaaaaa"
    assert unique_run_folder(tmp_path).name == "20260101-000000-bbbbbb"  # the first try met the folder above
    monkeypatch.setattr(run_folder.secrets, "token_hex", lambda n: "aaaaaa")
    with pytest.raises(FileExistsError, match="no free run folder name"):
        unique_run_folder(tmp_path, attempts=3)


def test_a_given_folder_must_be_new_or_empty(tmp_path: Path) -> None:
    assert claim_run_folder(tmp_path / "new" / "run") == tmp_path / "new" / "run"
    (tmp_path / "empty").mkdir()
    assert claim_run_folder(tmp_path / "empty") == tmp_path / "empty"
    assert (tmp_path / "empty" / CLAIM_FILE).is_file()
    # the second of two runs claiming one empty folder is refused
    with pytest.raises(ValueError, match=r"out='.*empty' is not empty: .* --resume"):
        claim_run_folder(tmp_path / "empty")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "diagnostics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match=r"out='.*used' is not empty"):
        claim_run_folder(tmp_path / "used")
    assert (tmp_path / "used" / "diagnostics.jsonl").read_text() == "{}\n"  # untouched
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"out='.*file' is a file"):
        claim_run_folder(tmp_path / "file")


def test_no_out_gives_a_new_folder_under_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first, second = new_run_folder(None), new_run_folder(None)
    assert first != second and first.parent == second.parent == Path("runs")
    assert first.is_dir() and not any(first.iterdir())


def _try_lock(path: str) -> str:
    try:
        lock_run_folder(path).close()
    except ValueError as error:
        return str(error)
    return "locked"


def test_a_run_folder_in_use_cannot_be_locked_by_another_process(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        lock = lock_run_folder(tmp_path)
        assert "is in use by another training process" in pool.apply(_try_lock, (str(tmp_path),))
        lock.close()
        assert pool.apply(_try_lock, (str(tmp_path),)) == "locked"
