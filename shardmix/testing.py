"""Testing helpers for users' own pipelines: check that a loader resumes exactly.

:func:`check_resume` runs a loader uninterrupted, then for every step restores a JSON copy of
the state taken there into a new loader and checks that the rest of the run is identical, and
that the state keeps one shape (the same keys and types) at every step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from shardmix.formats import INDEX_KEY, SOURCE_KEY
from shardmix.loader import MixingLoader


class ResumeMismatchError(AssertionError):
    """A restored loader went on differently from the uninterrupted one."""


def batch_fingerprint(batch: Any) -> tuple[tuple[str, int], ...]:
    """The (source, index) of each sample of a batch (or of its ``provenance``), in order."""
    provenance = batch if isinstance(batch, dict) else batch.provenance
    indexes = [int(i) for i in provenance[INDEX_KEY]]
    return tuple(zip(provenance[SOURCE_KEY], indexes, strict=True))


@dataclass(frozen=True)
class ResumeReport:
    """What :func:`check_resume` checked."""

    steps_checked: int
    total_steps: int
    largest_state_bytes: int


def run_steps(
    loader: MixingLoader, epochs: int, *, stop_at: int | None = None
) -> list[tuple[int, Any]]:
    """``(epoch, batch)`` pairs of a training loop of ``epochs`` epochs, up to ``stop_at``."""
    out: list[tuple[int, Any]] = []
    for epoch in range(loader.epoch, epochs):
        for batch in loader:
            out.append((epoch, batch))
            if stop_at is not None and len(out) == stop_at:
                return out
    return out


def checkpoint_after(
    loader: MixingLoader, epochs: int, step: int
) -> tuple[list[Any], dict[str, Any]]:
    """The first ``step`` batches of a training loop, and the state saved after the last of
    them (as plain JSON, read back)."""
    out: list[Any] = []
    for _ in range(loader.epoch, epochs):
        for batch in loader:  # the state is taken while the epoch's iterator lives
            out.append(batch)
            if len(out) == step:
                return out, json.loads(json.dumps(loader.state_dict()))
    raise ValueError(f"step {step} is outside the run's 1..{len(out)}")


def check_resume(
    make_loader: Callable[[], MixingLoader],
    *,
    epochs: int = 2,
    steps: Iterable[int] | None = None,
    fingerprint: Callable[[Any], Any] = batch_fingerprint,
) -> ResumeReport:
    """Check that a loader from ``make_loader`` resumes exactly after each of ``steps``
    (batches from the run's start; default: every one), else a :class:`ResumeMismatchError`."""
    reference = [fingerprint(batch) for _, batch in run_steps(make_loader(), epochs)]
    chosen: Sequence[int] = range(1, len(reference)) if steps is None else sorted(steps)
    shape = None
    largest = 0
    for step in chosen:
        if not 0 < step < len(reference):
            raise ValueError(f"step {step} is outside the run's 1..{len(reference) - 1}")
        interrupted = make_loader()
        _, state = checkpoint_after(interrupted, epochs, step)
        interrupted.close()
        largest = max(largest, len(json.dumps(state)))
        if shape is None:
            shape = _shape(state)
        elif _shape(state) != shape:
            raise ResumeMismatchError(
                f"the state's shape changed at step {step}: {_shape(state)} != {shape}"
            )
        restored = make_loader()
        restored.load_state_dict(state)
        rest = [fingerprint(batch) for _, batch in run_steps(restored, epochs)]
        restored.close()
        _compare(reference[step:], rest, step)
    return ResumeReport(len(chosen), len(reference), largest)


def _compare(expected: list[Any], found: list[Any], step: int) -> None:
    for offset, (want, got) in enumerate(zip(expected, found, strict=False)):
        if want != got:
            raise ResumeMismatchError(
                f"resumed after step {step}: batch {step + offset + 1} differs: "
                f"expected {want!r}, found {got!r}"
            )
    if len(expected) != len(found):
        raise ResumeMismatchError(
            f"resumed after step {step}: expected {len(expected)} more batches, found {len(found)}"
        )


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return "list"
    return type(value).__name__
