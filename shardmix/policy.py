"""Error policy: what happens to damaged data, and the ledger that counts what was skipped.

A reader given an ``on_damage`` callback reports each :class:`Damage` to it instead of raising;
damage that loses the framing drops the rest of the shard. :class:`SkipLedger` is that callback
under ``on_error="skip"``; its summary is plain JSON, so the workers' ledgers are merged in the
main process, which holds the ``max_skips`` budget.
"""

from __future__ import annotations

import copy
import enum
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from shardmix.errors import (
    ConfigError,
    CorruptShardError,
    DecodeError,
    SkippedDataWarning,
    TooManySkipsError,
)

__all__ = ["Damage", "DamageHandler", "ErrorPolicy", "OnError", "SkipLedger"]

# How many shards a TooManySkipsError message lists by name before "and N more".
_LISTED_SHARDS = 10


class OnError(enum.Enum):
    """What a reader does with damaged data."""

    RAISE = "raise"  # stop with the error (the default)
    SKIP = "skip"  # drop the damaged record (or the rest of the shard), count it, go on


@dataclass(frozen=True)
class ErrorPolicy:
    """How damaged data is handled: ``ErrorPolicy(OnError.SKIP, max_skips=100)``; past
    ``max_skips`` skips in an epoch (``None``: no limit), a :class:`TooManySkipsError`."""

    on_error: OnError = OnError.RAISE
    max_skips: int | None = 100

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "on_error", OnError(self.on_error))
        except ValueError:
            choices = ", ".join(repr(choice.value) for choice in OnError)
            raise ConfigError(f"on_error must be one of {choices}, got {self.on_error!r}") from None
        skips = self.max_skips
        if skips is not None and (isinstance(skips, bool) or not isinstance(skips, int)):
            raise ConfigError(f"max_skips must be an int or None, got {skips!r}")
        if skips is not None and skips < 0:
            raise ConfigError(f"max_skips must be >= 0 or None, got {skips}")

    @property
    def skips(self) -> bool:
        """Whether damaged data is skipped rather than raised."""
        return self.on_error is OnError.SKIP


@dataclass(frozen=True)
class Damage:
    """Damage a reader reported instead of raising ``error``: the loss starts at ``record``
    and ``offset`` and spans ``size`` bytes, or (``rest_of_shard``) the rest of the shard,
    ``records`` records when a count says."""

    error: CorruptShardError | DecodeError
    record: int | None
    offset: int | None
    size: int | None = None
    rest_of_shard: bool = False
    records: int | None = None

    @property
    def url(self) -> str:
        return self.error.url or "<unknown shard>"


DamageHandler = Callable[[Damage], None]


def _empty_shard_entry() -> dict[str, Any]:
    return {"skips": 0, "records": 0, "bytes": 0, "cut": 0, "uncounted": 0, "first": None}


class SkipLedger:
    """Counts what was skipped, per shard; usable as a reader's ``on_damage`` callback.

    Past ``max_skips`` skips it raises :class:`TooManySkipsError`; ``warn`` warns once per shard
    not in ``reported`` (workers pass ``None`` and ``False``: the main process's ledger does
    both). Its summary (docs/epochs.md): ``skips``, ``records``, ``bytes``, ``shards_cut`` and
    ``uncounted_cuts``, and the same per shard under ``shards`` with its ``first`` damage.
    """

    def __init__(
        self, max_skips: int | None = None, *, warn: bool = True, reported: Collection[str] = ()
    ) -> None:
        self.max_skips = max_skips
        self.warn = warn
        self._reported = reported
        self._shards: dict[str, dict[str, Any]] = {}
        self._fresh: dict[str, dict[str, Any]] = {}  # what take() has not handed out yet

    @classmethod
    def for_policy(
        cls, policy: ErrorPolicy, *, warn: bool = True, reported: Collection[str] = ()
    ) -> SkipLedger:
        return cls(policy.max_skips, warn=warn, reported=reported)

    def __call__(self, damage: Damage) -> None:
        """Count one piece of damage (the ``on_damage`` callback)."""
        cut = damage.rest_of_shard
        entry = {
            "skips": 1,
            "records": (damage.records or 0) if cut else 1,
            "bytes": damage.size or 0,
            "cut": int(cut),
            "uncounted": int(cut and damage.records is None),
            "first": _describe(damage),
        }
        self._add({damage.url: entry})

    def merge(self, other_summary: Mapping[str, Any]) -> None:
        """Add the skips of another ledger's :meth:`summary` (or :meth:`take`) to this one."""
        shards = other_summary.get("shards", {})
        if not isinstance(shards, Mapping):
            raise TypeError(f"not a SkipLedger summary: {other_summary!r}")
        self._add(shards)

    def _add(self, shards: Mapping[str, Mapping[str, Any]]) -> None:
        for url, counts in shards.items():
            for table in (self._shards, self._fresh):
                entry = table.get(url)
                if entry is None:
                    entry = table[url] = _empty_shard_entry()
                    if table is self._shards and self.warn and url not in self._reported:
                        _warn_first(url, counts)
                # A shard read as pieces is cut once, however many of its pieces (in however
                # many workers) met the cut: one skip and one cut shard, its lost records summed.
                cut = int(counts.get("cut", 0))
                was_cut = entry["cut"]
                entry["cut"] = int(bool(was_cut or cut))
                entry["skips"] += int(counts.get("skips", 0)) - cut - was_cut + entry["cut"]
                entry["uncounted"] = max(entry["uncounted"], int(counts.get("uncounted", 0)))
                for name in ("records", "bytes"):
                    entry[name] += int(counts.get(name, 0))
                if entry["first"] is None:
                    entry["first"] = counts.get("first")
        self.check()

    def check(self) -> None:
        """Raise :class:`TooManySkipsError` if more than ``max_skips`` skips were counted."""
        if self.max_skips is not None and self.skips > self.max_skips:
            raise TooManySkipsError(self._too_many())

    @property
    def skips(self) -> int:
        """Skips counted so far: records dropped plus shards cut short."""
        return sum(entry["skips"] for entry in self._shards.values())

    def __bool__(self) -> bool:
        return bool(self._shards)

    def summary(self) -> dict[str, Any]:
        """Everything counted so far, as plain JSON types (a copy)."""
        return _summary(self._shards)

    def take(self) -> dict[str, Any] | None:
        """What was counted since the last ``take()`` (a worker's delta), or None."""
        if not self._fresh:
            return None
        fresh, self._fresh = self._fresh, {}
        return _summary(fresh)

    def _too_many(self) -> str:
        total = self.summary()
        listed = sorted(self._shards.items(), key=lambda item: -item[1]["skips"])
        lines = [
            f"{url}: {entry['skips']} skips ({entry['records']} records, {entry['bytes']} "
            f"bytes, cut short {entry['cut']} times); first: {entry['first']}"
            for url, entry in listed[:_LISTED_SHARDS]
        ]
        if len(listed) > _LISTED_SHARDS:
            lines.append(f"... and {len(listed) - _LISTED_SHARDS} more shards")
        return (
            f"{total['skips']} skips of damaged data, more than max_skips={self.max_skips}: "
            f"{total['records']} records ({total['bytes']} bytes) dropped and "
            f"{total['shards_cut']} shards cut short, in {len(listed)} shards; the data is "
            "badly damaged: repair or re-create it (`shardmix stat --verify` lists every "
            "damaged shard), or raise max_skips. Skipped:\n" + "\n".join(lines)
        )

    def __repr__(self) -> str:
        return f"SkipLedger(skips={self.skips}, shards={len(self._shards)})"


def _summary(shards: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    copied = copy.deepcopy(dict(shards))
    names = ("skips", "records", "bytes", "shards_cut", "uncounted_cuts")
    keys = ("skips", "records", "bytes", "cut", "uncounted")
    totals = {
        name: sum(e[key] for e in copied.values()) for name, key in zip(names, keys, strict=True)
    }
    return {**totals, "shards": copied}


def _describe(damage: Damage) -> str:
    message = str(damage.error)
    if damage.rest_of_shard:
        return f"{message} [the rest of the shard, from record {damage.record}, was skipped]"
    return f"{message} [record {damage.record} was skipped]"


def _warn_first(url: str, counts: Mapping[str, Any]) -> None:
    warnings.warn(
        SkippedDataWarning(
            f"skipping damaged data in {url} (on_error='skip'): {counts.get('first')}; "
            "further skips in this shard are counted, not warned about"
        ),
        stacklevel=4,
    )
