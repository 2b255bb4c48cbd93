"""on_error="skip" under canonical ranks read in one process: the skip is booked to the
canonical rank whose lane met the damage, whatever the world size, so every world size that
divides the canonical ranks gives the same global batches (``even_ranks="pad"``: the short
canonical rank pads, counted), and the same skips."""

from __future__ import annotations

import warnings

import pytest
from test_skip_resume import damaged_set

from shardmix import MixingLoader, ShardDataset

CANONICAL = 4


def global_batches(pattern: str, world_size: int) -> tuple[list[list[str]], dict]:
    """Each step's batches of every rank, in rank order; every canonical rank's skips."""
    loaders = [
        MixingLoader(
            ShardDataset(pattern, on_error="skip"),
            batch_size=4,
            num_workers=0,
            rank=rank,
            world_size=world_size,
            canonical_ranks=CANONICAL,
            even_ranks="pad",
        )
        for rank in range(world_size)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_rank = [[list(batch["__key__"]) for batch in loader] for loader in loaders]
    skipped: dict = {}
    for loader in loaders:
        skipped.update(loader.skipped)
    steps = [sum(batches, []) for batches in zip(*per_rank, strict=True)]
    return steps, {rank: entry["records"] for rank, entry in skipped.items()}


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_skip_is_the_same_canonical_ranks_on_any_world(tmp_path, world_size):
    pattern = damaged_set(tmp_path)
    steps, skipped = global_batches(pattern, world_size)
    expected_steps, expected_skipped = global_batches(pattern, CANONICAL)
    assert steps == expected_steps
    assert skipped == expected_skipped
    assert sum(skipped.values()) == 1
