"""The loader's checkpoint: its ``state_dict()`` assembled, and a saved one taken back.

A state is the version, the settings it was taken under (``config``: the shards' digest, the
seeds, the batch, lanes and buffer, the world; a mixture's per dataset) and the positions:
under several ranks every rank's, gathered over the ranks (:mod:`shardmix.rankstate`), or
this rank's canonical ranks' (:mod:`shardmix.canonical`). The position is the current
epoch's, the start of the next one, or the one a ``load_state_dict()`` left to resume from.
Taking a state back checks its version and shape, then its settings against the loader's
(the world and batch sizes may change where :mod:`shardmix.elastic` resizes the position),
and keeps this rank's position for the next ``iter()``. :class:`LoaderCheckpoint` is that
part of the loader.

Left to others: the state's JSON and its checks (:mod:`shardmix.checkpoint`), each epoch's
position (:mod:`shardmix.batching.epoch`, :mod:`shardmix.mixture`, :mod:`shardmix.canonical`),
whether an epoch goes on (:mod:`shardmix.loaderlength`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from shardmix.batching.epoch import EpochIterator
from shardmix.batching.epochplan import epoch_start
from shardmix.canonical import (
    CanonicalEpoch,
    check_canonical,
    gather_canonical,
    own_positions,
    start_positions,
)
from shardmix.checkpoint import (
    STATE_VERSION,
    check_config,
    check_version,
    shards_digest,
)
from shardmix.dataset import ShardDataset
from shardmix.elastic import ELASTIC_FIELDS, check_mixture_world, resized_position
from shardmix.loaderlength import LoaderLength
from shardmix.mixture import MixtureEpoch, mixture_start
from shardmix.plan.apportion import member_seed
from shardmix.plan.sharding import canonical_slots
from shardmix.rankstate import gather_positions, own_position
from shardmix.statefields import check_state


class LoaderCheckpoint(LoaderLength):
    """A MixingLoader's ``state_dict()`` and ``load_state_dict()``."""

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out, as plain JSON types.

        After an epoch's last batch (counted by ``len()``), or once a newer ``iter()`` was
        made, that is the next epoch's start. Under torch.distributed the state holds every
        rank's position, gathered with ``all_gather_object``: call it on every rank at the
        same step (Lightning does), and save any one rank's copy.
        """
        shard_dataset = self._shard_dataset("state_dict")
        rank, world_size = self.rank_and_world_size()
        if self.canonical_ranks is not None:
            positions = self._canonical_positions()
            config = self._config(shard_dataset)
            return gather_canonical(
                positions, config, world_size, self.canonical_ranks, self.data_parallel_group
            )
        position = self._position(shard_dataset, world_size)
        config = self._mixture_config() if self.datasets else self._config(shard_dataset)
        gathered = gather_positions(position, rank, world_size, self.data_parallel_group)
        return {"version": STATE_VERSION, "config": config, **gathered}

    def _canonical_positions(self) -> dict[str, Any]:
        """This rank's canonical ranks' positions (see ``_position``)."""
        if self._resume is not None:
            return copy.deepcopy(self._resume)
        if self._in_epoch():
            assert isinstance(self._current, CanonicalEpoch)
            return self._current.positions()
        return start_positions(self, self.epoch)

    def _position(self, dataset: ShardDataset, world_size: int) -> dict[str, Any]:
        if self._resume is not None:
            return copy.deepcopy(self._resume)
        if self._in_epoch():
            assert isinstance(self._current, (EpochIterator, MixtureEpoch))
            return self._current.position()
        if self.datasets is not None:
            return mixture_start(self.mixture_settings(), self.epoch)
        return epoch_start(self.epoch, self.num_lanes_for(dataset, world_size))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` yields what would have followed it.

        Under several ranks each rank takes its own position from the state, whichever rank
        saved it.
        """
        shard_dataset = self._shard_dataset("load_state_dict")
        check_version(state)
        check_canonical(state, self.canonical_ranks)
        check_state(state)
        config = self._mixture_config() if self.datasets else self._config(shard_dataset)
        saved = state["config"]
        if self.datasets is not None:
            check_mixture_world(saved, config)
        free = self._elastic_fields(shard_dataset)
        check_config(saved, config, free=free)
        rank, world_size = self.rank_and_world_size()
        if self.canonical_ranks is not None:
            slots = canonical_slots(rank, world_size, self.canonical_ranks)
            position = own_positions(state, slots)
            self.epoch = int(next(iter(position.values()))["epoch"])
        elif any(saved.get(field) != config[field] for field in free):
            position = resized_position(
                state,
                shard_dataset,
                rank=rank,
                world_size=world_size,
                num_lanes=self.num_lanes_for(shard_dataset, world_size),
                even_ranks=self.even_ranks,
            )
            self.epoch = int(position["epoch"])
        else:
            position = own_position(state, rank)
            self.epoch = int(position["epoch"])
        self._stop_current()
        self._resume = copy.deepcopy(position)
        self._current = None

    def _elastic_fields(self, dataset: ShardDataset) -> tuple[str, ...]:
        """The settings a resume may change (:mod:`shardmix.elastic`): the world and batch
        sizes, and the lanes and buffer where they follow them by default. None for a
        mixture, or with ``canonical_ranks`` (whose states resume on the worlds that divide
        it)."""
        if self.datasets is not None or self.canonical_ranks is not None:
            return ()
        given = {"num_lanes": dataset.num_lanes, "shuffle_buffer": self.shuffle_buffer}
        return tuple(field for field in ELASTIC_FIELDS if given.get(field) is None)

    def _config(self, dataset: ShardDataset) -> dict[str, Any]:
        _, world_size = self.planning_world()
        canonical = {} if self.canonical_ranks is None else {"canonical_ranks": world_size}
        return {
            "num_shards": len(dataset.urls),
            "shards": shards_digest(dataset.urls),
            "dataset_seed": dataset.seed,
            "shuffle_shards": dataset.shuffle_shards,
            "num_lanes": self.num_lanes_for(dataset, world_size),
            "piece_records": dataset.piece_records,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle_buffer": self.shuffle_buffer_size(),
            "shuffle_buffer_bytes": self.shuffle_buffer_bytes,
            "drop_last": self.drop_last,
            "world_size": world_size,
            "even_ranks": self.even_ranks.value,
            **canonical,
        }

    def _mixture_config(self) -> dict[str, Any]:
        datasets = self.datasets or {}
        members = {
            name: self._config(dataset) | {"seed": member_seed(self.seed, index)}
            for index, (name, dataset) in enumerate(datasets.items())
        }
        return {"datasets": members, "stopping": self.stopping.value}
