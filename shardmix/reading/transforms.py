"""The transform contract: decoding, the user's transform, filtering, seeded augmentation.

A dataset's samples pass through here in the process that reads them (a DataLoader worker,
or the main process with no workers), one record at a time:

- **decode** (optional) turns a record's fields into values (:mod:`shardmix.reading.decode`);
- **transform** (optional) is the user's function. Returning ``None`` *filters* the sample
  out. With ``transform_rng=True`` it is called as ``transform(sample, rng)`` with a
  ``numpy.random.Generator`` seeded from ``(dataset seed, epoch, pass, shard index, record
  index)``: the same record gets the same draws in every run and in every re-read after a
  resume, so random augmentation keeps resume exact.
- A decode or transform that raises is wrapped in :class:`~shardmix.errors.TransformError`
  naming the shard, record, byte offset and key, chained to the original. Under
  ``on_error="skip"`` it is reported to the error policy's ledger and counted like damage.

A record that is filtered out or skipped does not vanish: it leaves a *tombstone*, a small
dict holding only its provenance and :data:`DROPPED` (``"filtered"`` or ``"skipped"``). The
tombstone travels to the main process like a sample, where the mixer counts it and moves its
lane's position past it, and is never batched. That is what keeps the filter count exact and
makes a resumed lane start after the records it already dropped instead of dropping them
twice. Direct iteration drops tombstones at once (:func:`without_tombstones`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmix.errors import DecodeError, TransformError, describe_position
from shardmix.formats.tags import TAG_KEY
from shardmix.policy import Damage, DamageHandler
from shardmix.reading.decode import Decoder

Sample = dict[str, Any]

PROVENANCE_KEYS = ("__key__", "__source__", "__index__", "__offset__")

# The key that marks a tombstone, and its two values.
DROPPED = "__dropped__"
FILTERED = "filtered"
SKIPPED = "skipped"

# Keeps transform draws apart from every other stream seeded from the same numbers.
_TRANSFORM_STREAM = 0x7A5F


@dataclass(frozen=True)
class SampleTransform:
    """Decode, transform and filter the records of one shard (picklable, for the workers).

    Args:
        transform: the user's function: ``f(sample)``, or ``f(sample, rng)`` with ``rng``.
        decode: applied before ``transform`` (e.g. a :class:`~shardmix.reading.decode.Decoder`).
        rng: call ``transform(sample, rng)`` with a generator seeded per record.
        seed: the dataset's seed, the first part of every record's generator seed.
    """

    transform: Callable[..., Sample | None] | None = None
    decode: Callable[[Sample], Sample] | None = None
    rng: bool = False
    seed: int = 0

    @property
    def active(self) -> bool:
        return self.transform is not None or self.decode is not None

    def apply(
        self,
        samples: Iterator[Sample],
        *,
        epoch: int,
        shard_index: int,
        on_damage: DamageHandler | None,
        epoch_pass: int = 0,
        example: bool = False,
    ) -> Iterator[Sample]:
        """``samples`` decoded and transformed, a tombstone in place of each one dropped.
        ``example``: they are TFRecord Examples, whose features a
        :class:`~shardmix.reading.decode.Decoder` decodes by type (:meth:`Decoder.example`).

        A record's tag (``__tag__``: :mod:`shardmix.formats.tags`) is held back from the
        decoder and the transform, and put back in what they give (a dict) or the tombstone.
        """
        for sample in samples:
            tag = sample.pop(TAG_KEY, None)
            try:
                result = self._one(sample, epoch, epoch_pass, shard_index, example)
            except Exception as error:  # noqa: BLE001 - any failure of user code is wrapped
                wrapped = _wrap(error, sample)
                if on_damage is None:
                    raise wrapped from error
                on_damage(Damage(wrapped, sample.get("__index__"), sample.get("__offset__")))
                result = tombstone(sample, SKIPPED)
            else:
                if result is None:
                    result = tombstone(sample, FILTERED)
            if tag is not None and isinstance(result, dict):
                result[TAG_KEY] = tag
            yield result

    def _one(
        self, sample: Sample, epoch: int, epoch_pass: int, shard_index: int, example: bool
    ) -> Sample | None:
        provenance = {key: sample[key] for key in PROVENANCE_KEYS if key in sample}
        if example and isinstance(self.decode, Decoder):
            sample = self.decode.example(sample)
        elif self.decode is not None:
            sample = self.decode(sample)
        if self.transform is None:
            return sample
        if self.rng:
            rng = record_rng(self.seed, epoch, epoch_pass, shard_index, provenance["__index__"])
            result = self.transform(sample, rng)
        else:
            result = self.transform(sample)
        if isinstance(result, dict):
            for key, value in provenance.items():
                result.setdefault(key, value)
        return result


def record_rng(
    seed: int, epoch: int, epoch_pass: int, shard_index: int, record: int
) -> np.random.Generator:
    """The generator a seeded transform gets for one record.

    >>> a = record_rng(17, 0, 0, 3, 5).integers(1 << 30)
    >>> bool(a == record_rng(17, 0, 0, 3, 5).integers(1 << 30))
    True
    >>> bool(a == record_rng(17, 1, 0, 3, 5).integers(1 << 30))
    False
    """
    return np.random.default_rng([_TRANSFORM_STREAM, seed, epoch, epoch_pass, shard_index, record])


def tombstone(sample: Sample, kind: str) -> Sample:
    """What is left of a sample that was dropped: its provenance and why."""
    dropped = {key: sample[key] for key in PROVENANCE_KEYS if key in sample}
    dropped[DROPPED] = kind
    return dropped


def is_tombstone(sample: Sample) -> bool:
    return DROPPED in sample


def without_tombstones(
    samples: Iterator[Sample], count: Callable[[str], None] | None = None
) -> Iterator[Sample]:
    """The samples that were kept; ``count(kind)`` is called for each one dropped."""
    for sample in samples:
        if DROPPED in sample:
            if count is not None:
                count(sample[DROPPED])
            continue
        yield sample


def without_tags(samples: Iterator[Sample]) -> Iterator[Sample]:
    """``samples`` without their records' tags (what direct iteration gives)."""
    for sample in samples:
        if isinstance(sample, dict):
            sample.pop(TAG_KEY, None)
        yield sample


def _wrap(error: Exception, sample: Sample) -> DecodeError:
    url = sample.get("__source__") or "<unknown shard>"
    record = sample.get("__index__")
    offset = sample.get("__offset__")
    where = describe_position(url, offset=offset, record=record)
    what = "decoding" if isinstance(error, DecodeError) else "the transform"
    return TransformError(
        f"{where}: {what} failed on the sample with key {sample.get('__key__')!r}: "
        f"{type(error).__name__}: {error}; fix the data or the transform, or pass "
        "on_error='skip' to skip and count such samples",
        url=url,
        offset=offset,
        record=record,
    )
