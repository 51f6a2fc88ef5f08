"""The LOBSTER cache is an optimisation: an unusable cache costs one warning, never the load; an
unreadable data file is a ValueError naming it."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

import foxenv.data.cache as cache_module
import foxenv.data.lobster as lobster_module
from foxenv.data import CacheWarning, load_lobster, load_market
from tests.foxenv.test_lobster import scenario, write_pair

FIELDS = ("bid_price", "ask_size", "flow_ref_tick", "exec_bid", "cancel_ask", "time", "halted")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def cache_warnings(load) -> tuple[object, list[warnings.WarningMessage]]:
    """Run ``load()`` and return its result and the CacheWarnings it emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = load()
    return result, [w for w in caught if issubclass(w.category, CacheWarning)]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """The scenario pair, written under ``tmp_path / "data"``."""
    return write_pair(tmp_path / "data", *scenario())


@pytest.fixture
def reference(pair: tuple[Path, Path], tmp_path: Path):
    """The scenario loaded with a working cache (by events of 2)."""
    return load_lobster(*pair, step_events=2, cache_dir=tmp_path / "good_cache")


def assert_same(data, reference) -> None:
    for name in FIELDS:
        assert torch.equal(getattr(data, name), getattr(reference, name)), name
    assert data.tick_size == reference.tick_size and data.name == reference.name


def test_cache_folder_that_is_a_file_warns_once(pair, reference, tmp_path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache folder should be")
    data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=blocker))
    assert_same(data, reference)
    assert len(caught) == 1 and "could not write" in str(caught[0].message)
    assert str(blocker) in str(caught[0].message)
    # Twice, through load_market as well: still one warning per load.
    data, caught = cache_warnings(lambda: load_market(pair, step_events=2, cache_dir=blocker / "deeper"))
    assert_same(data, reference)
    assert len(caught) == 1


def test_home_that_cannot_hold_a_cache_warns_once(pair, reference, tmp_path, monkeypatch) -> None:
    home = tmp_path / "home_file"
    home.write_text("")
    monkeypatch.delenv("FOXHUNT_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(home))
    data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2))
    assert_same(data, reference)
    assert len(caught) == 1 and "could not write" in str(caught[0].message)


def test_no_home_at_all_warns_once(pair, reference, monkeypatch) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("FOXHUNT_CACHE_DIR", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(cache_module.Path, "home", staticmethod(no_home))
    data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2))
    assert_same(data, reference)
    assert len(caught) == 1 and "no cache folder" in str(caught[0].message)
    assert "FOXHUNT_CACHE_DIR" in str(caught[0].message)


@pytest.mark.skipif(IS_ROOT, reason="root may write into a read-only folder")
def test_read_only_cache_folder_warns_once(pair, reference, tmp_path) -> None:
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=folder))
    finally:
        folder.chmod(0o700)
    assert_same(data, reference)
    assert len(caught) == 1


def test_cache_write_error_warns_once_and_leaves_no_temporary_file(pair, reference, tmp_path,
                                                                    monkeypatch) -> None:
    def failing_save(payload: object, path: Path) -> None:
        Path(path).write_bytes(b"partial")
        raise RuntimeError(f"File {path} cannot be opened.")

    monkeypatch.setattr(cache_module.torch, "save", failing_save)
    folder = tmp_path / "cache"
    data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=folder))
    assert_same(data, reference)
    assert len(caught) == 1
    assert list(folder.iterdir()) == []


def test_unreadable_cache_entry_warns_once(pair, reference, tmp_path, monkeypatch) -> None:
    folder = tmp_path / "good_cache"  # holds the reference's entry

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache_module.torch, "load", denied)
    data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=folder))
    assert_same(data, reference)
    assert len(caught) == 1 and "Permission denied" in str(caught[0].message)


def test_cache_folder_that_cannot_be_listed_warns_once(pair, reference, tmp_path, monkeypatch) -> None:
    real_is_file = Path.is_file

    def guarded_is_file(self: Path) -> bool:
        if self.suffix == ".pt":
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    monkeypatch.setattr(cache_module.Path, "is_file", guarded_is_file)
    data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=tmp_path / "c"))
    assert_same(data, reference)
    assert len(caught) == 1 and "could not read" in str(caught[0].message)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped"])
def test_damaged_cache_entry_warns_once_and_is_rebuilt(pair, reference, tmp_path, damage) -> None:
    folder = tmp_path / "good_cache"
    (entry,) = folder.glob("*.pt")
    content = entry.read_bytes()
    if damage == "garbage":
        entry.write_bytes(b"not a torch file")
    elif damage == "truncated":
        entry.write_bytes(content[: len(content) // 2])
    else:  # one byte of the stored prices flipped: the zip still loads, the checksum does not match
        payload = torch.load(entry, weights_only=True)
        payload["bid_price"][0, 0] += 0.01
        torch.save(payload, entry)
    data, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=folder))
    assert_same(data, reference)
    assert len(caught) == 1 and str(entry) in str(caught[0].message)
    # The rebuilt entry replaced the damaged one: the next load is silent and served from the cache.
    again, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=folder))
    assert_same(again, reference)
    assert caught == []


def test_working_cache_is_silent(pair, tmp_path) -> None:
    for _ in range(2):
        _, caught = cache_warnings(lambda: load_lobster(*pair, step_events=2, cache_dir=tmp_path / "c"))
        assert caught == []


# ----------------------------------------------------------------------------------------------
# Unreadable data files: a ValueError naming the file (not a PermissionError from inside pandas).


def test_unreadable_data_file_names_it(pair, tmp_path, monkeypatch) -> None:
    real_open = open

    def guarded_open(file: object, *args: object, **kwargs: object):
        if Path(str(file)) == pair[1]:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(lobster_module, "open", guarded_open, raising=False)
    with pytest.raises(ValueError, match=r"orderbook_path='.*_orderbook_2.csv' cannot be read: Permission"):
        load_lobster(*pair, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"orderbook_path='.*' cannot be read"):
        load_market(pair, cache_dir=tmp_path / "cache")


def test_parse_of_unreadable_file_names_it(pair, monkeypatch) -> None:
    def denied(path: object, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(lobster_module.pd, "read_csv", denied)
    with pytest.raises(ValueError, match=r"message file '.*_message_2.csv' cannot be read: Permission de"):
        lobster_module.parse_lobster(*pair)


@pytest.mark.skipif(IS_ROOT, reason="root reads files without read permission")
def test_data_file_without_read_permission_names_it(pair, tmp_path) -> None:
    pair[0].chmod(0o000)
    try:
        with pytest.raises(ValueError, match=r"message_path='.*_message_2.csv' cannot be read"):
            load_lobster(*pair, cache_dir=tmp_path / "cache")
    finally:
        pair[0].chmod(0o600)
