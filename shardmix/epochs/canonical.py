"""Canonical ranks: the same global batches on every world size that divides a fixed one.

``MixingLoader(..., canonical_ranks=C)`` plans every epoch for ``C`` ranks whatever the job's
world size ``W``. Each *canonical rank* ``c`` is read exactly as a loader with the simulated
world ``rank=c, world_size=C`` reads it: its own lanes, mixer and shuffle buffer (an
:class:`~shardmix.batching.epoch.EpochIterator`). Physical rank ``r`` runs the canonical ranks
``r * C/W`` to ``(r + 1) * C/W - 1`` side by side and joins their batches of ``batch_size``,
in canonical order, into one batch of ``C/W * batch_size`` samples. So the sequence of global
batches (one step's samples over all ranks) does not depend on ``W``, and a state saved on one
world size resumes on any other that divides ``C``, mid-epoch included.

The state is a ``C``-rank state keyed by canonical rank (:mod:`shardmix.rankstate`'s layout:
the lowest canonical rank held at the top level, the others under ``"ranks"``), with a
``"canonical"`` field of its own version. Under torch.distributed :func:`gather_canonical`
collects every physical rank's canonical ranks; with ranks simulated in one process each
loader's state holds its own, and :func:`merge_states` joins them.

This module owns the split of canonical ranks over physical ranks, the joined batches and the
canonical state; the epoch itself, its workers and the checkpoint format are the epoch's,
the pool's and the checkpoint's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardmix.batching.collate import collate_samples, join_batches, pin_batch
from shardmix.batching.epoch import EpochIterator
from shardmix.batching.epochplan import epoch_start
from shardmix.batching.settings import EpochSettings
from shardmix.checkpoint import STATE_VERSION
from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.plan.sharding import canonical_slots
from shardmix.reading.pool import WorkerPool
from shardmix.world import state_exchange

if TYPE_CHECKING:
    from shardmix.epochs.options import LoaderSettings

CANONICAL_VERSION = 1

# The top-level keys of a canonical state that are not its first canonical rank's position.
_NOT_POSITION = ("version", "config", "rank", "ranks", "canonical")


class CanonicalEpoch:
    """One epoch of the canonical ranks this rank runs, their batches joined in order.

    With one canonical rank per physical rank its batches are that rank's, as they are.
    With more, the default collate's batches are joined column by column
    (:func:`~shardmix.batching.collate.join_batches`: the batch it would make of all their samples);
    under another ``collate_fn`` each canonical rank's epoch hands out its samples, and
    ``collate_fn`` collates them once, joined.
    """

    def __init__(
        self, loader: LoaderSettings, epoch: int, resume: Mapping[str, Any] | None
    ) -> None:
        canonical_ranks = loader.canonical_ranks
        assert canonical_ranks is not None  # the loader makes one only then
        rank, world_size = loader.rank_and_world_size()
        self.slots = canonical_slots(rank, world_size, canonical_ranks)
        self.epoch = epoch
        self.collate_fn = loader.collate_fn
        self.pin_memory = loader.pin_memory
        self.closed = False
        self._joined = len(self.slots) > 1
        # The default collate's batches join as columns; another's samples join as samples.
        self._by_column = self._joined and loader.collate_fn is collate_samples
        self.streams: list[EpochIterator] = []
        settings = loader.epoch_settings()
        try:
            for slot, canonical in enumerate(self.slots):
                samples = self._joined and not self._by_column
                pool = slot_pool(loader, slot)
                own = canonical_rank_settings(
                    settings,
                    canonical,
                    canonical_ranks,
                    pool,
                    samples=samples,
                    alone=not self._joined,
                )
                position = None if resume is None else resume[str(canonical)]
                self.streams.append(EpochIterator(own, epoch, position))
        except BaseException:
            self.close()
            raise

    @property
    def finished(self) -> bool:
        """Every batch of the epoch was handed out (each canonical rank's last one cut)."""
        return all(stream.finished for stream in self.streams)

    @property
    def batches(self) -> int:
        """Batches handed out this epoch (each canonical rank gave as many)."""
        return self.streams[0].batches

    def __iter__(self) -> CanonicalEpoch:
        return self

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        parts = []
        try:
            for stream in self.streams:
                parts.append(next(stream))
        except StopIteration:
            if parts:
                self.close()
                raise self._uneven(len(parts)) from None
            raise
        except BaseException:
            self.close()
            raise
        if not self._joined:
            return parts[0]
        if self._by_column:
            batch = join_batches(parts)
        else:
            batch = self.collate_fn([sample for part in parts for sample in part])
        return pin_batch(batch) if self.pin_memory else batch

    def _uneven(self, ended: int) -> ConfigError:
        early = self.slots[ended]
        return ConfigError(
            f"epoch {self.epoch}: canonical rank {early} ended after {self.batches - 1} "
            f"batches while canonical rank {self.slots[0]} had one more; the canonical ranks "
            "yield the same number of samples unless a transform drops samples or the shards "
            "changed while being read: keep them unchanged, and filter before writing shards"
        )

    def close(self) -> None:
        """Stop every canonical rank's reading (persistent workers keep running)."""
        self.closed = True
        for stream in self.streams:
            stream.close()

    def __del__(self) -> None:
        self.close()

    def positions(self) -> dict[str, Any]:
        """Each canonical rank's position, keyed by the canonical rank as a string."""
        return {
            str(canonical): stream.position()
            for canonical, stream in zip(self.slots, self.streams, strict=True)
        }

    @property
    def filtered(self) -> dict[str, int]:
        """The canonical ranks' :attr:`~shardmix.batching.epoch.EpochIterator.filtered`, summed."""
        total = {"dropped": 0, "padded": 0, "undelivered": 0}
        for stream in self.streams:
            for kind, count in stream.filtered.items():
                total[kind] += count
        return total

    @property
    def skipped(self) -> dict[str, Any] | None:
        """Each canonical rank's skip summary under ``on_error="skip"``, by canonical rank."""
        found = {
            str(canonical): stream.skipped.summary()
            for canonical, stream in zip(self.slots, self.streams, strict=True)
            if stream.skipped is not None
        }
        return found or None


def canonical_rank_settings(
    settings: EpochSettings,
    canonical: int,
    canonical_ranks: int,
    pool: WorkerPool | None,
    *,
    samples: bool,
    alone: bool,
) -> EpochSettings:
    """A rank's epoch settings as one of its canonical ranks reads by: the simulated world
    ``(canonical, canonical_ranks)``, the workers of its slot on this rank (``pool``), and
    with ``samples`` (its samples joined with other canonical ranks') samples handed out as
    they are, for one collate of the joined batch. Pinned memory is for the joined batch only
    (``alone``: the rank's only canonical rank, whose batches are the rank's).
    """
    return dataclasses.replace(
        settings,
        rank=canonical,
        world_size=canonical_ranks,
        # A canonical rank's epoch agrees on its end with no other (a filter follows the rules
        # of simulated ranks), whichever group the physical ranks form.
        group=None,
        pool=pool,
        collate_fn=list if samples else settings.collate_fn,
        pin_memory=settings.pin_memory and alone,
    )


def slot_pool(loader: LoaderSettings, slot: int) -> WorkerPool | None:
    """The persistent workers of this rank's ``slot``-th canonical rank (None: per-epoch
    workers). Slot 0 has the loader's own pool; the others get theirs at their first epoch,
    so a rank runs ``C/W * num_workers`` worker processes."""
    if slot == 0 or loader.pool is None:
        return loader.pool
    name = f"canonical slot {slot}"
    pool = loader.pools.get(name)
    if pool is None:
        pool = loader.pools[name] = loader.new_pool(loader.dataset)
    return pool


def start_positions(loader: LoaderSettings, epoch: int) -> dict[str, Any]:
    """This rank's canonical ranks at the start of ``epoch``, before any batch."""
    canonical_ranks = loader.canonical_ranks
    assert canonical_ranks is not None
    rank, world_size = loader.rank_and_world_size()
    dataset = loader.dataset
    assert isinstance(dataset, ShardDataset)  # the loader takes no other with canonical_ranks
    lanes = loader.num_lanes_for(dataset, canonical_ranks)
    return {
        str(canonical): epoch_start(epoch, lanes)
        for canonical in canonical_slots(rank, world_size, canonical_ranks)
    }


def gather_canonical(
    positions: Mapping[str, Any],
    config: Mapping[str, Any],
    world_size: int,
    canonical_ranks: int,
    group: Any = None,
) -> dict[str, Any]:
    """The state of ``positions`` (this rank's canonical ranks) and, under torch.distributed,
    every other rank's (``group``: the data-parallel group, if not the default one): a
    collective of the default group there, called by every rank at the same step."""
    held = dict(positions)
    exchange = state_exchange(world_size, group)
    if exchange is not None:
        for theirs in exchange(held):
            held.update(theirs)
    return canonical_state(held, config, canonical_ranks)


def canonical_state(
    positions: Mapping[str, Any], config: Mapping[str, Any], canonical_ranks: int
) -> dict[str, Any]:
    """A state of the canonical ranks' ``positions`` (keyed by canonical rank as a string)."""
    order = sorted(positions, key=int)
    first = order[0]
    return {
        "version": STATE_VERSION,
        "config": dict(config),
        **positions[first],
        "rank": int(first),
        "ranks": {key: positions[key] for key in order[1:]},
        "canonical": {"version": CANONICAL_VERSION, "canonical_ranks": canonical_ranks},
    }


def held_positions(state: Mapping[str, Any]) -> dict[str, Any]:
    """The positions a canonical state holds, keyed by canonical rank as a string."""
    first = {key: value for key, value in state.items() if key not in _NOT_POSITION}
    return {str(state.get("rank")): first, **dict(state.get("ranks") or {})}


def check_canonical(state: Mapping[str, Any], canonical_ranks: int | None) -> None:
    """Refuse a state saved with other canonical ranks than ``canonical_ranks`` (None: none),
    or whose canonical field this shardmix does not read."""
    saved = state.get("canonical")
    if saved is None:
        if canonical_ranks is not None:
            raise ConfigError(
                f"cannot resume with canonical_ranks={canonical_ranks}: the loader state was "
                "saved without canonical_ranks; resume it with the loader's settings then"
            )
        return
    if not isinstance(saved, Mapping) or saved.get("version") != CANONICAL_VERSION:
        found = saved.get("version") if isinstance(saved, Mapping) else saved
        raise ConfigError(
            f"cannot resume: the loader state's 'canonical' field has version {found!r}, this "
            f"shardmix reads version {CANONICAL_VERSION}"
        )
    if saved.get("canonical_ranks") != canonical_ranks:
        raise ConfigError(
            f"cannot resume: the loader state was saved with canonical_ranks="
            f"{saved.get('canonical_ranks')!r} but this loader has canonical_ranks="
            f"{canonical_ranks!r}; pass the checkpoint's canonical_ranks"
        )


def own_positions(state: Mapping[str, Any], slots: range) -> dict[str, Any]:
    """The positions of the canonical ranks ``slots`` in ``state``, all at one step."""
    held = held_positions(state)
    missing = [canonical for canonical in slots if str(canonical) not in held]
    if missing:
        raise ConfigError(
            f"cannot resume canonical ranks {missing}: the loader state holds canonical ranks "
            f"{sorted(map(int, held))} only; save it with state_dict() on every rank under "
            "torch.distributed, or join simulated ranks' states with "
            "shardmix.epochs.canonical.merge_states"
        )
    steps = {(held[key]["epoch"], held[key]["batches"]) for key in held}
    if len(steps) > 1:
        raise ConfigError(
            f"cannot resume: the loader state's canonical ranks are at different (epoch, "
            f"batches) {sorted(steps)}; join states saved at the same step"
        )
    return {str(canonical): held[str(canonical)] for canonical in slots}


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state of every canonical rank held by ``states`` (simulated ranks' states, saved
    at the same step with the same settings), which resumes any world size.

    >>> merge_states([])
    Traceback (most recent call last):
    ...
    shardmix.errors.ConfigError: merge_states needs at least one loader state
    """
    if not states:
        raise ConfigError("merge_states needs at least one loader state")
    first = states[0]
    saved = first.get("canonical")
    if not isinstance(saved, Mapping):
        raise ConfigError(
            "cannot merge: loader state 0 was saved without canonical_ranks; merge_states "
            "joins the states of a loader with canonical_ranks"
        )
    check_canonical(first, saved.get("canonical_ranks"))
    held: dict[str, Any] = {}
    for at, state in enumerate(states):
        for field in ("version", "config", "canonical"):
            if state.get(field) != first.get(field):
                raise ConfigError(
                    f"cannot merge: loader state {at}'s {field!r} differs from state 0's; "
                    "merge the states of one job, saved at the same step"
                )
        held.update(held_positions(state))
    return canonical_state(held, first["config"], first["canonical"]["canonical_ranks"])
