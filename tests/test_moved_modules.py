"""Modules that moved keep working by their old names for one release, with a warning that
names the new place."""

import importlib
import sys

import pytest

import shardmix

MOVED = [
    ("shardmix.stat", "shardmix.inspect.stat"),
    ("shardmix.checkpoint", "shardmix.state.codec"),
]


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_an_old_module_name_imports_the_new_module_with_a_warning(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delitem(vars(shardmix), old.rsplit(".", 1)[1], raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is module


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_an_old_module_name_works_as_an_attribute_and_in_from_imports(old, new, monkeypatch):
    name = old.rsplit(".", 1)[1]
    monkeypatch.delitem(vars(shardmix), name, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = getattr(shardmix, name)
    assert module is importlib.import_module(new)


def test_the_old_names_users_imported_work(monkeypatch):
    for old, _ in MOVED:
        monkeypatch.delitem(sys.modules, old, raising=False)
        monkeypatch.delitem(vars(shardmix), old.rsplit(".", 1)[1], raising=False)
    with pytest.warns(DeprecationWarning):
        from shardmix.stat import stat_shards
    with pytest.warns(DeprecationWarning):
        from shardmix.checkpoint import STATE_VERSION
    assert stat_shards is shardmix.inspect.stat_shards
    assert STATE_VERSION == importlib.import_module("shardmix.state.codec").STATE_VERSION


def test_other_missing_names_are_still_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        shardmix.nothing_here  # noqa: B018
