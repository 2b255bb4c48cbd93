"""The loader state's fields: which a position holds, of what kind, and the refusal of a state
whose fields are missing or of the wrong type, naming the field (the layout is the epoch's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardmix.errors import ConfigError

# The fields of one dataset's position and what each holds: a non-negative int ("count"),
# a packed string ("packed"), ints ("ints"), lists of seven ints ("lanes"), or nested fields.
_POSITION: dict[str, Any] = {
    "epoch": "count",
    "batches": "count",
    "emitted": "count",
    "pad": "packed",
    "dropped": {"filtered": "count", "skipped": "count", "padded": "count"},
    "mixer": {"live": "ints", "cursor": "count", "lanes": "lanes"},
    "buffer": {"draws": "count", "items": "packed", "sizes": "packed", "tags": "packed"},
    "shards": "list",
    "phase": "phase",
}
_MIXTURE = {"epoch": "count", "batches": "count", "mixture": "mapping"}
# Past every count and byte offset a state holds (a file's offsets are below 2**63): a larger
# number is refused here, not met as an OverflowError or an OSError deep in a restore.
MOST = 1 << 63


def check_state(state: Mapping[str, Any]) -> None:
    """Refuse a state whose fields are missing or of the wrong type, naming the field."""
    _check_fields(state, {"config": "mapping", "ranks": "mapping"}, "")
    positions = [state, *state["ranks"].values()]
    for at, position in enumerate(positions):
        where = "" if at == 0 else f"ranks.{list(state['ranks'])[at - 1]}."
        _check_position(position, where)


def _check_position(position: Any, where: str) -> None:
    if not isinstance(position, Mapping):
        refuse_field(where.rstrip("."), "a dict of fields", position)
    if "mixture" not in position:
        _check_fields(position, _POSITION, where)
        return
    _check_fields(position, _MIXTURE, where)
    datasets = position["mixture"].get("datasets")
    if not isinstance(datasets, Mapping):
        refuse_field(f"{where}mixture.datasets", "a dict of positions", datasets)
    for name, member in datasets.items():
        _check_position(member, f"{where}mixture.datasets.{name}.")


def _check_fields(values: Mapping[str, Any], fields: Mapping[str, Any], where: str) -> None:
    for name, kind in fields.items():
        field = f"{where}{name}"
        if name not in values:
            raise ConfigError(
                f"cannot resume: the loader state has no {field!r} field; the state was edited "
                "or damaged since it was saved, or another program wrote it"
            )
        value = values[name]
        if isinstance(kind, Mapping):
            if not isinstance(value, Mapping):
                refuse_field(field, "a dict of fields", value)
            _check_fields(value, kind, f"{field}.")
        elif not _CHECKS[kind](value):
            refuse_field(field, _KINDS[kind], value)


_KINDS = {
    "count": "a non-negative int below 2**63",
    "packed": "a packed string",
    "ints": "a list of non-negative ints below 2**63",
    "lanes": "a list of lane positions, seven ints each, in range",
    "mapping": "a dict",
    "list": "a list",
    "phase": "{} or a dict of 'pieces' (a packed string), 'quota', 'own' and 'batches' (counts)",
}


def _is_phase(value: Any) -> bool:
    if not isinstance(value, Mapping):
        return False
    if not value:
        return True
    counts = ("quota", "own", "batches")
    return (
        set(value) == {"pieces", *counts}
        and isinstance(value["pieces"], str)
        and all(is_count(value[name]) for name in counts)
    )


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MOST


def _is_lane(lane: Any) -> bool:
    """``[slot, record, offset, shard, start, stop, tag]``: offset, shard, stop may be -1."""
    return (
        isinstance(lane, list)
        and len(lane) == 7
        and all(isinstance(value, int) and not isinstance(value, bool) for value in lane)
        and all(0 <= value < MOST for value in (lane[0], lane[1], lane[4]))
        and all(-1 <= value < MOST for value in (lane[2], lane[3], lane[5]))
        and 0 <= lane[6] < 1 << 16
    )


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "count": is_count,
    "packed": lambda value: isinstance(value, str),
    "ints": lambda value: isinstance(value, list) and all(map(is_count, value)),
    "lanes": lambda value: isinstance(value, list) and all(map(_is_lane, value)),
    "mapping": lambda value: isinstance(value, Mapping),
    "list": lambda value: isinstance(value, list),
    "phase": _is_phase,
}


def refuse_field(field: str, expected: str, found: Any) -> None:
    shown = repr(found) if len(repr(found)) <= 60 else f"{type(found).__name__} value"
    raise damaged(field, f"should be {expected}, found {shown}")


def damaged(field: str, what: str) -> ConfigError:
    """The error for a state whose ``field`` ``what``."""
    return ConfigError(
        f"cannot resume: the loader state's {field!r} {what}; the state was edited or damaged "
        "since it was saved"
    )
