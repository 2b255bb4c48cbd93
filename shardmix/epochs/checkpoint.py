"""The loader's checkpoint: its ``state_dict()`` assembled, and a saved one taken back.

A state is the version, the settings it was taken under and every rank's position
(``docs/checkpoint.md``); taking it back checks them, resizes the position where the world or
batch size changed (:mod:`shardmix.epochs.elastic`) and keeps it for the next ``iter()``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from shardmix.batching.epochplan import epoch_start
from shardmix.dataset import ShardDataset
from shardmix.epochs.canonical import start_positions
from shardmix.epochs.contract import Cursor
from shardmix.epochs.elastic import ELASTIC_FIELDS, check_mixture_world, resized_position
from shardmix.epochs.length import in_epoch
from shardmix.epochs.mixture import mixture_start
from shardmix.epochs.options import LoaderOptions
from shardmix.plan.apportion import member_seed
from shardmix.plan.sharding import canonical_slots
from shardmix.state.codec import STATE_VERSION, check_config, check_version, shards_digest
from shardmix.state.fields import check_state
from shardmix.state.ranks import (
    check_canonical,
    gather_canonical,
    gather_positions,
    own_position,
    own_positions,
)


def state_dict(options: LoaderOptions, cursor: Cursor) -> dict[str, Any]:
    """The position after the last batch handed out, as plain JSON types (after an epoch's
    last batch, or once a newer ``iter()`` was made, the next epoch's start). Under
    torch.distributed it gathers every rank's position: call it on every rank at the same step.
    """
    dataset = options.shard_dataset("state_dict")
    rank, world_size = options.rank_and_world_size()
    group = options.ranks.group
    if options.canonical_ranks is not None:
        positions = _position(options, cursor, lambda: start_positions(options, cursor.epoch))
        config = _config(options, dataset)
        return gather_canonical(positions, config, world_size, options.canonical_ranks, group)
    if options.datasets is not None:
        position = _position(options, cursor, lambda: mixture_start(options, cursor.epoch))
        config = _mixture_config(options)
    else:
        lanes = options.num_lanes_for(dataset, world_size)
        position = _position(options, cursor, lambda: epoch_start(cursor.epoch, lanes))
        config = _config(options, dataset)
    gathered = gather_positions(position, rank, world_size, group)
    return {"version": STATE_VERSION, "config": config, **gathered}


def _position(
    options: LoaderOptions, cursor: Cursor, start: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """The position to resume from, else the current epoch's, else ``start()``."""
    if cursor.resume is not None:
        return copy.deepcopy(cursor.resume)
    if cursor.current is not None and in_epoch(options, cursor):
        return cursor.current.position()
    return start()


def load_state_dict(options: LoaderOptions, cursor: Cursor, state: Mapping[str, Any]) -> None:
    """Continue from ``state``: the next ``iter()`` yields what would have followed it (each
    rank takes its own position, whichever rank saved it)."""
    dataset = options.shard_dataset("load_state_dict")
    check_version(state)
    check_canonical(state, options.canonical_ranks)
    check_state(state)
    config = _mixture_config(options) if options.datasets else _config(options, dataset)
    saved = state["config"]
    if options.datasets is not None:
        check_mixture_world(saved, config)
    free = _elastic_fields(options, dataset)
    check_config(saved, config, free=free)
    rank, world_size = options.rank_and_world_size()
    if options.canonical_ranks is not None:
        slots = canonical_slots(rank, world_size, options.canonical_ranks)
        position = own_positions(state, slots)
        cursor.epoch = int(next(iter(position.values()))["epoch"])
    elif any(saved.get(field) != config[field] for field in free):
        position = resized_position(
            state,
            dataset,
            rank=rank,
            world_size=world_size,
            num_lanes=options.num_lanes_for(dataset, world_size),
            even_ranks=options.even_ranks,
        )
        cursor.epoch = int(position["epoch"])
    else:
        position = own_position(state, rank)
        cursor.epoch = int(position["epoch"])
    cursor.stop_current()
    cursor.resume = copy.deepcopy(position)
    cursor.current = None


def _elastic_fields(options: LoaderOptions, dataset: ShardDataset) -> tuple[str, ...]:
    """The settings a resume may change: the world and batch sizes, and the lanes and buffer
    where they follow them by default. None for a mixture, or with ``canonical_ranks``."""
    if options.datasets is not None or options.canonical_ranks is not None:
        return ()
    given = {"num_lanes": dataset.plan.num_lanes, "shuffle_buffer": options.shuffle_buffer}
    return tuple(field for field in ELASTIC_FIELDS if given.get(field) is None)


def _config(options: LoaderOptions, dataset: ShardDataset) -> dict[str, Any]:
    _, world_size = options.planning_world()
    canonical = {} if options.canonical_ranks is None else {"canonical_ranks": world_size}
    return {
        "num_shards": len(dataset.urls),
        "shards": shards_digest(dataset.urls),
        "dataset_seed": dataset.plan.seed,
        "shuffle_shards": dataset.plan.shuffle_shards,
        "num_lanes": options.num_lanes_for(dataset, world_size),
        "piece_records": dataset.plan.piece_records,
        "seed": options.seed,
        "batch_size": options.batch_size,
        "shuffle_buffer": options.shuffle_buffer_size(),
        "shuffle_buffer_bytes": options.shuffle_buffer_bytes,
        "drop_last": options.drop_last,
        "world_size": world_size,
        "even_ranks": options.even_ranks.value,
        **canonical,
    }


def _mixture_config(options: LoaderOptions) -> dict[str, Any]:
    members = {
        name: _config(options, dataset) | {"seed": member_seed(options.seed, index)}
        for index, (name, dataset) in enumerate((options.datasets or {}).items())
    }
    return {"datasets": members, "stopping": options.stopping.value}
