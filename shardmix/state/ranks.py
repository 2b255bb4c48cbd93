"""Rank state: one loader state for every rank, so that one rank's checkpoint resumes them all.

Trainers such as Lightning save the loader state from rank 0 only, then hand that one state to
every rank on resume. So under torch.distributed :func:`gather_positions` collects every rank's
position (``all_gather_object`` on the default group, through
:func:`~shardmix.world.state_exchange`) into the state: the saving rank's position at the top
level, as with a single rank, beside ``"rank"`` (which rank that is) and ``"ranks"`` (every
other rank's position, keyed by the rank as a string). :func:`own_position` picks the loading
rank's. Ranks here are data-parallel ranks: under ``MixingLoader(group=...)`` the ranks of one
model replica share one, so the state holds each data-parallel rank's position once (checked
to be the same on every rank of the replica). With ranks simulated in one process
(``MixingLoader(rank=, world_size=)``) there is nothing to gather: ``"ranks"`` is empty and the
state resumes its own rank only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmix.errors import ConfigError
from shardmix.world import state_exchange

# The top-level keys of a state that are not its saving rank's position.
_NOT_POSITION = ("version", "config", "rank", "ranks")


def gather_positions(
    position: dict[str, Any], rank: int, world_size: int, group: Any = None
) -> dict[str, Any]:
    """``position`` with every other data-parallel rank's, gathered when torch.distributed
    runs the ranks (``group``: the data-parallel group, if not the default one).

    A collective of the default group under torch.distributed: every rank must call it at the
    same point.
    """
    exchange = state_exchange(world_size, group)
    if exchange is None:
        return {**position, "rank": rank, "ranks": {}}
    first: dict[int, tuple[int, dict[str, Any]]] = {}  # data rank: (job rank, its position)
    for holder, (other, theirs) in enumerate(exchange((rank, position))):
        if other not in first:
            first[other] = holder, theirs
        elif theirs != first[other][1]:
            raise _replica_error(other, first[other], (holder, theirs))
    others = {str(other): theirs for other, (_, theirs) in sorted(first.items()) if other != rank}
    return {**position, "rank": rank, "ranks": others}


def _replica_error(
    rank: int, one: tuple[int, dict[str, Any]], other: tuple[int, dict[str, Any]]
) -> ConfigError:
    """The error for two ranks of one model replica at different positions."""
    (first, mine), (second, theirs) = one, other
    return ConfigError(
        f"ranks {first} and {second} of the job share data-parallel rank {rank} but are at "
        f"different positions (epoch {mine.get('epoch')} batch {mine.get('batches')}, and "
        f"epoch {theirs.get('epoch')} batch {theirs.get('batches')}): the ranks of one model "
        "replica must draw the same batches; call state_dict() on every rank at the same step"
    )


def own_position(state: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """The position of ``rank`` in ``state``, refusing a state that does not hold it."""
    saved_by = state.get("rank")
    if saved_by == rank:
        return {key: value for key, value in state.items() if key not in _NOT_POSITION}
    ranks = state.get("ranks") or {}
    if str(rank) not in ranks:
        raise ConfigError(
            f"cannot resume rank {rank}: the loader state holds the position of rank "
            f"{saved_by} only (and of ranks {sorted(ranks, key=int)}); save the state with "
            "state_dict() called on every rank under torch.distributed, which gathers them all"
        )
    return dict(ranks[str(rank)])


def as_saved_by(state: Mapping[str, Any], rank: int = 0) -> dict[str, Any]:
    """``state`` as ``rank`` would have saved it: the same on every rank that gathered it.

    A state that does not hold ``rank``'s position (ranks simulated in one process) is
    returned as it is.
    """
    positions = {str(state.get("rank")): own_position(state, state.get("rank", 0))}
    positions.update(state.get("ranks") or {})
    if str(rank) not in positions:
        return dict(state)
    others = {key: positions[key] for key in sorted(positions, key=int) if key != str(rank)}
    shared = {key: state[key] for key in ("version", "config") if key in state}
    return {**shared, **positions[str(rank)], "rank": rank, "ranks": others}


def every_position(state: Mapping[str, Any], world_size: int) -> list[dict[str, Any]]:
    """The position of each of ranks ``0 .. world_size - 1`` in ``state``, refusing a state
    that does not hold them all (what a resume on another world size needs)."""
    held = [str(state.get("rank")), *(state.get("ranks") or {})]
    missing = [rank for rank in range(world_size) if str(rank) not in held]
    if missing:
        raise ConfigError(
            f"cannot resume on another world_size: the loader state was saved by "
            f"{world_size} ranks but holds the positions of ranks {sorted(map(int, held))} "
            f"only, not of {missing}; save it with state_dict() called on every rank under "
            "torch.distributed, or join simulated ranks' states with join_states()"
        )
    return [own_position(state, rank) for rank in range(world_size)]


def join_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state holding the positions of ranks simulated in one process or more
    (``MixingLoader(rank=, world_size=)``), as torch.distributed would have gathered it.

    ``states`` are the ranks' ``state_dict()``, taken at the same step, in any order.
    """
    if not states:
        raise ConfigError("join_states() needs at least one rank's state")
    first = states[0]
    positions: dict[str, Any] = {}
    for state in states:
        for field in ("version", "config"):
            if state.get(field) != first.get(field):
                raise ConfigError(
                    f"cannot join the states of ranks {first.get('rank')} and "
                    f"{state.get('rank')}: their {field!r} differs; join the states of one "
                    "job's ranks, saved at the same step"
                )
        rank = state.get("rank")
        positions[str(rank)] = own_position(state, rank)  # type: ignore[arg-type]
        for other, position in (state.get("ranks") or {}).items():
            positions.setdefault(other, dict(position))
    others = {key: positions[key] for key in sorted(positions, key=int) if key != "0"}
    if "0" not in positions:
        raise ConfigError(
            f"cannot join the states: none is rank 0's (ranks {sorted(positions, key=int)})"
        )
    shared = {field: first[field] for field in ("version", "config") if field in first}
    return {**shared, **positions["0"], "rank": 0, "ranks": others}
