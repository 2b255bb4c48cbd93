"""The fixed run behind the golden checkpoint states (tests/golden/state/).

Six uneven shards written by shardmix's own writers under relative names, with a fixed
modification time, read by a MixingLoader with fixed seeds: the state after batch 7 depends on
nothing but shardmix's code. ``tools/make_golden_state.py`` writes the JSON files from here;
``tests/state/test_golden_state.py`` compares them with what the code gives now.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from shardmix import MixingLoader, ShardDataset

from shards import write_shards

SIZES = [30, 45, 12, 60, 25, 38]
BATCHES = 7
FIXED_MTIME_NS = 1_700_000_000_000_000_000
GOLDEN = Path(__file__).parent / "golden" / "state"


def golden_path(fmt: str, version: int) -> Path:
    return GOLDEN / f"v{version}-{fmt}-batch{BATCHES}.json"


def make_loader(fmt: str) -> MixingLoader:
    """The loader of the fixed run, over shards in ``./data`` (the caller's working folder)."""
    pattern = write_shards(Path("data"), fmt, SIZES)
    for path in Path("data").iterdir():
        os.utime(path, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
    dataset = ShardDataset(pattern, seed=17)
    # A buffer of 8 batches: at batch 7 it is warming up (it emits from 4 batches on).
    return MixingLoader(dataset, batch_size=8, num_workers=0, seed=17, shuffle_buffer=64)


def state_after_batches(fmt: str) -> dict[str, Any]:
    """``state_dict()`` of the fixed run after batch 7, as plain JSON (keys as saved)."""
    loader = make_loader(fmt)
    batches = iter(loader)
    for _ in range(BATCHES):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state
