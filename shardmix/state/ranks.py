"""Rank state: one loader state for every rank, so that one rank's checkpoint resumes them all.

:func:`gather_positions` puts every data-parallel rank's position in the state: the saving
rank's at the top level beside ``"rank"``, the others' in ``"ranks"`` (keyed by the rank as a
string); :func:`own_position` picks the loading rank's; :func:`join_states` joins the states of
simulated ranks. A ``canonical_ranks`` state has the same layout over the canonical ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmix.errors import ConfigError
from shardmix.state.codec import STATE_VERSION
from shardmix.world import state_exchange

CANONICAL_VERSION = 1

# The top-level keys of a state that are not its saving (or first canonical) rank's position.
_NOT_POSITION = ("version", "config", "rank", "ranks", "canonical")


def gather_positions(
    position: dict[str, Any], rank: int, world_size: int, group: Any = None
) -> dict[str, Any]:
    """``position`` with every other data-parallel rank's (a collective), checking that the
    ranks of one model replica are at one position."""
    exchange = state_exchange(world_size, group)
    if exchange is None:
        return {**position, "rank": rank, "ranks": {}}
    first: dict[int, tuple[int, dict[str, Any]]] = {}  # data rank: (job rank, its position)
    for holder, (other, theirs) in enumerate(exchange((rank, position))):
        if other not in first:
            first[other] = holder, theirs
        elif theirs != first[other][1]:
            earlier, mine = first[other]
            raise ConfigError(
                f"ranks {earlier} and {holder} of the job share data-parallel rank {other} but "
                f"are at different positions (epoch {mine.get('epoch')} batch "
                f"{mine.get('batches')}, and epoch {theirs.get('epoch')} batch "
                f"{theirs.get('batches')}): the ranks of one model replica must draw the same "
                "batches; call state_dict() on every rank at the same step"
            )
    others = {str(other): theirs for other, (_, theirs) in sorted(first.items()) if other != rank}
    return {**position, "rank": rank, "ranks": others}


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
    """``state`` as ``rank`` would have saved it (or as it is, without ``rank``'s position)."""
    positions = {str(state.get("rank")): own_position(state, state.get("rank", 0))}
    positions.update(state.get("ranks") or {})
    if str(rank) not in positions:
        return dict(state)
    return _saved_by(state, positions, rank)


def _saved_by(shared: Mapping[str, Any], positions: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """The state that ``rank`` saves of ``positions``, with ``shared``'s version and config."""
    others = {key: positions[key] for key in sorted(positions, key=int) if key != str(rank)}
    kept = {key: shared[key] for key in ("version", "config") if key in shared}
    return {**kept, **positions[str(rank)], "rank": rank, "ranks": others}


def every_position(state: Mapping[str, Any], world_size: int) -> list[dict[str, Any]]:
    """The positions of ranks ``0 .. world_size - 1`` in ``state``, refusing a state without one."""
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
    """One state of the positions of simulated ranks (``MixingLoader(rank=, world_size=)``),
    as torch.distributed would gather it, from their ``state_dict()`` at one step, in any order
    (states of ``canonical_ranks``: one state of every canonical rank they hold)."""
    if not states:
        raise ConfigError("join_states() needs at least one rank's state")
    first = states[0]
    if "canonical" in first:
        return _join_canonical(states)
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
        if not isinstance(rank, int):
            raise ConfigError(f"cannot join a state without its rank (found rank {rank!r})")
        positions[str(rank)] = own_position(state, rank)
        for other, position in (state.get("ranks") or {}).items():
            positions.setdefault(other, dict(position))
    if "0" not in positions:
        raise ConfigError(
            f"cannot join the states: none is rank 0's (ranks {sorted(positions, key=int)})"
        )
    return _saved_by(first, positions, 0)


def _join_canonical(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state of every canonical rank held by ``states`` (see :func:`join_states`)."""
    first = states[0]
    saved = first["canonical"]
    check_canonical(first, saved.get("canonical_ranks") if isinstance(saved, Mapping) else None)
    held: dict[str, Any] = {}
    for at, state in enumerate(states):
        for field in ("version", "config", "canonical"):
            if state.get(field) != first.get(field):
                raise ConfigError(
                    f"cannot join the states: loader state {at}'s {field!r} differs from state "
                    "0's; join the states of one job, saved at the same step"
                )
        held.update(held_positions(state))
    return canonical_state(held, first["config"], first["canonical"]["canonical_ranks"])


def gather_canonical(
    positions: Mapping[str, Any],
    config: Mapping[str, Any],
    world_size: int,
    canonical_ranks: int,
    group: Any = None,
) -> dict[str, Any]:
    """The state of ``positions`` (this rank's canonical ranks) and every other rank's."""
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
    shared = {"version": STATE_VERSION, "config": dict(config)}
    return {
        **_saved_by(shared, positions, min(map(int, positions))),
        "canonical": {"version": CANONICAL_VERSION, "canonical_ranks": canonical_ranks},
    }


def held_positions(state: Mapping[str, Any]) -> dict[str, Any]:
    """The positions a canonical state holds, keyed by canonical rank as a string."""
    first = {key: value for key, value in state.items() if key not in _NOT_POSITION}
    return {str(state.get("rank")): first, **dict(state.get("ranks") or {})}


def check_canonical(state: Mapping[str, Any], canonical_ranks: int | None) -> None:
    """Refuse a state saved with other ``canonical_ranks`` (None: none), or another version."""
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
            "torch.distributed, or join simulated ranks' states with shardmix.join_states"
        )
    steps = {(held[key]["epoch"], held[key]["batches"]) for key in held}
    if len(steps) > 1:
        raise ConfigError(
            f"cannot resume: the loader state's canonical ranks are at different (epoch, "
            f"batches) {sorted(steps)}; join states saved at the same step"
        )
    return {str(canonical): held[str(canonical)] for canonical in slots}
