"""Golden checkpoint states: the state's layout and values change only on purpose.

A change to the state (a field, a packing, the order the seeds give) shows up here as a diff
against the committed JSON. A deliberate change bumps ``STATE_VERSION``, writes the new files
with ``python tools/make_golden_state.py`` and keeps the old ones, which must then be refused by
name.
"""

from __future__ import annotations

import json

import pytest
from golden_state import BATCHES, GOLDEN, golden_path, make_loader, state_after_batches

from shardmix import ConfigError
from shardmix.state.codec import STATE_VERSION

from shards import batch_keys


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_state_after_batch_7_equals_the_committed_one(tmp_path, monkeypatch, fmt):
    monkeypatch.chdir(tmp_path)
    path = golden_path(fmt, STATE_VERSION)
    hint = "run tools/make_golden_state.py"
    assert path.exists(), f"no golden state for version {STATE_VERSION}: {hint}"
    assert state_after_batches(fmt) == json.loads(path.read_text())


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_the_committed_state_resumes_where_the_run_went_on(tmp_path, monkeypatch, fmt):
    monkeypatch.chdir(tmp_path)
    whole = make_loader(fmt)
    rest = batch_keys(list(whole)[BATCHES:])
    whole.close()
    resumed = make_loader(fmt)
    resumed.load_state_dict(json.loads(golden_path(fmt, STATE_VERSION).read_text()))
    assert batch_keys(resumed) == rest
    resumed.close()


def test_older_golden_states_are_refused_by_version(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    older = [
        path
        for path in sorted(GOLDEN.glob("v*-*.json"))
        if json.loads(path.read_text())["version"] != STATE_VERSION
    ]
    for path in older:
        fmt = path.name.split("-")[1]
        loader = make_loader(fmt)
        saved = json.loads(path.read_text())["version"]
        with pytest.raises(ConfigError, match=rf"version {saved}\b"):
            loader.load_state_dict(json.loads(path.read_text()))
        loader.close()
