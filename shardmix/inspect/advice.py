"""Advice: the settings that would raise a low share of the ideal, each tried by a real run.

The inspection is passed in (:attr:`Context.inspect`), so this module depends on the report only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardmix.inspect.report import (
    HIGH_DRIFT_RATIO,
    LOW_SHARE,
    LOW_TENTH_SHARE,
    Advice,
    InspectReport,
    InspectSettings,
    OrderStats,
    RunSummary,
    Suggestion,
)
from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS, default_num_lanes, default_shuffle_buffer

# The defaults are reported as better than explicit settings only by more than this.
_MARGIN = 0.01


@dataclass(frozen=True)
class Context:
    """What an inspection was asked for and ran with, to try other settings on."""

    urls: str | Sequence[str]
    given: InspectSettings  # as asked (None: the default)
    ran: InspectSettings  # as run (defaults resolved)
    record_counts: Mapping[str, int] | None
    num_shards: int
    shards: dict[str, int]  # the rank's shards and their records
    inspect: Callable[..., InspectReport]  # inspect_batches, to run again with a change

    def counted(self) -> dict[str, int]:
        """The record counts given, and those of the rank's shards."""
        return {**(self.record_counts or {}), **self.shards}

    def rerun(self, progress: bool, **changes: Any) -> InspectReport:
        """The same inspection with ``changes`` (no advice, no baseline)."""
        options = {f.name: getattr(self.given, f.name) for f in dataclasses.fields(self.given)}
        options["record_counts"] = self.record_counts
        options.update(changes)
        return self.inspect(self.urls, **options, advise=False, progress=progress)


def advise(
    context: Context,
    summary: RunSummary,
    order: OrderStats | None,
    by_size: bool,
    pieces: bool,
    progress: bool,
) -> Advice:
    """Try the settings that could raise a low share, and the defaults when settings differ;
    and, when the run drifts (``order``), the piece setting that spreads shards over the
    epoch (``pieces``: whether shards were cut into pieces)."""
    share, lowest = summary.share_of_ideal, summary.min_tenth_share
    low = share < LOW_SHARE or lowest < LOW_TENTH_SHARE
    suggestions = []
    if low:
        for setting, value, how, changes in _candidates(context, summary, by_size):
            tried = context.rerun(progress, **changes).summary
            if tried.share_of_ideal > share + _MARGIN or tried.min_tenth_share > lowest + _MARGIN:
                suggestions.append(
                    Suggestion(setting, value, how, tried.share_of_ideal, tried.min_tenth_share)
                )
        suggestions.sort(key=lambda s: (-s.share_of_ideal, -s.min_tenth_share))
    defaults = None
    default = {name: f.default for name, f in InspectSettings.__dataclass_fields__.items()}
    explicit = {
        name: getattr(context.given, name)
        for name in ("num_lanes", "shuffle_buffer", "shuffle_buffer_bytes")
        if getattr(context.given, name) != default[name]
    }
    if explicit:
        reset = {name: default[name] for name in explicit}
        tried = context.rerun(progress, **reset).summary
        if tried.share_of_ideal > share + _MARGIN:
            how = ", ".join(f"{name}={value}" for name, value in explicit.items())
            defaults = Suggestion(
                "defaults", None, f"leave out {how}", tried.share_of_ideal, tried.min_tenth_share
            )
    messages = _messages(summary, low, suggestions, defaults, context)
    ratio = None if order is None else order.drift_ratio
    drifting = ratio is not None and ratio > HIGH_DRIFT_RATIO
    if drifting and order is not None:
        suggestions += _spread(context, order, pieces, progress, messages)
    return Advice(low, share, lowest, suggestions, defaults, messages, drifting, ratio)


def _spread(
    context: Context, order: OrderStats, pieces: bool, progress: bool, messages: list[str]
) -> list[Suggestion]:
    """The setting that spreads each shard over the epoch, tried: smaller pieces when shards
    were cut, else pieces (``piece_records`` unset) or counts to cut them by (a manifest)."""
    ran = context.ran.piece_records
    value: Any
    if ran is None or pieces:
        # A quarter of the pieces read now (a shard's records when whole, on the mean).
        records = ran or sum(context.shards.values()) // max(1, len(context.shards))
        setting, value = "piece_records", max(1, min(records, DEFAULT_PIECE_RECORDS) // 4)
        how = f"ShardDataset(piece_records={value})"
        changes: dict[str, Any] = {setting: value}
    else:
        setting, value = "record_counts", "manifest"
        how = (
            "these shards are read whole (remote with no manifest, or gzip): write them with "
            "`shardmix convert` (a manifest beside them) or pass ShardDataset(record_counts="
            "...), so that they can be cut into pieces"
        )
        changes = {"record_counts": context.counted()}
    tried = context.rerun(progress, **changes)
    found = tried.run.judged_order
    ratio = None if found is None else found.drift_ratio
    what = f"{context.ran.label!r} values" if context.ran.label else "shards"
    messages.append(
        f"the epoch drifts: each tenth's mix of {what} is {order.drift:.3f} away from the "
        f"whole epoch's, {order.drift_ratio:.2f}x a random order's ({order.random_drift:.3f})"
    )
    figure = "?" if ratio is None else f"{ratio:.2f}x"
    named = "a manifest" if setting == "record_counts" else f"piece_records={value}"
    messages.append(f"- {named} would give {figure}: {how}")
    summary = tried.summary
    return [Suggestion(setting, value, how, summary.share_of_ideal, summary.min_tenth_share, ratio)]


def _candidates(
    context: Context, summary: RunSummary, by_size: bool
) -> list[tuple[str, Any, str, dict[str, Any]]]:
    """``(setting, value, how to set it, inspect_batches changes)`` worth trying."""
    ran = context.ran
    ran_lanes, ran_buffer = ran.num_lanes or 1, ran.shuffle_buffer or 0  # resolved by the run
    found: list[tuple[str, Any, str, dict[str, Any]]] = []

    def add(setting: str, value: int, owner: str) -> None:
        found.append((setting, value, f"{owner}({setting}={value})", {setting: value}))

    per_rank = max(1, context.num_shards // ran.world_size)
    lanes = max(
        default_num_lanes(batch_size=ran.batch_size, shards_per_rank=per_rank),
        min(per_rank, 2 * ran_lanes),
    )
    if lanes > ran_lanes:
        add("num_lanes", lanes, "ShardDataset")
    samples = sum(context.shards.values())
    buffer = min(samples, max(default_shuffle_buffer(ran.batch_size), 4 * ran_buffer))
    if buffer > ran_buffer:
        add("shuffle_buffer", buffer, "MixingLoader")
    budget = ran.shuffle_buffer_bytes
    held = min(samples, ran_buffer) * summary.mean_sample_bytes
    if budget is not None and held > budget:
        add("shuffle_buffer_bytes", math.ceil(held / (1 << 20)) << 20, "MixingLoader")
    if not by_size:
        how = (
            "write the shards with `shardmix convert` (a manifest beside them), or pass "
            "ShardDataset(record_counts=...), so that lanes are read by size"
        )
        found.append(("record_counts", "manifest", how, {"record_counts": context.counted()}))
    return found


def _messages(
    summary: RunSummary,
    low: bool,
    suggestions: Sequence[Suggestion],
    defaults: Suggestion | None,
    context: Context,
) -> list[str]:
    lines = []
    figures = (
        f"{summary.share_of_ideal:.2f} of the uniformly random ideal (lowest tenth of the "
        f"epoch {summary.min_tenth_share:.2f})"
    )
    if low:
        lines.append(
            f"batches mix poorly: {figures}, under {LOW_SHARE} (or a tenth under {LOW_TENTH_SHARE})"
        )
        lines += [f"- {_tried(suggestion)}" for suggestion in suggestions]
        if not suggestions:
            lines.append(
                f"- no setting tried raises it; with {context.ran.num_lanes} lanes over "
                f"{len(context.shards)} shards, more (smaller) shards would: rewrite them with "
                "`shardmix convert --max-records N`"
            )
    if defaults is not None:
        lines.append(
            f"explicit settings keep the mixing lower than the defaults would: {figures} now; "
            f"{_tried(defaults)}"
        )
    return lines


def _tried(suggestion: Suggestion) -> str:
    named = {
        "record_counts": "lanes read by size (record counts known)",
        "defaults": "the defaults",
    }
    what = named.get(suggestion.setting, f"{suggestion.setting}={suggestion.value}")
    return (
        f"{what} would give {suggestion.share_of_ideal:.2f} (lowest tenth "
        f"{suggestion.min_tenth_share:.2f}): {suggestion.how}"
    )
