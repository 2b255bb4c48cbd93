"""The transform contract: decoding, the user's transform, filtering, seeded augmentation.

Samples pass through here in the process that reads them, one record at a time: decode, then
the user's transform, which filters a sample out by returning ``None``; with
``transform_rng=True`` it also gets a generator seeded per record (:func:`record_rng`). What it
returns must be what ``default_collate`` takes at the top, the same kind for every sample. A
record dropped leaves a *tombstone* (why: docs/design/reading.md).
"""

from __future__ import annotations

import reprlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shardmix.errors import DecodeError, TransformError, describe_position
from shardmix.formats import DROPPED_KEY, INDEX_KEY, KEY_FIELD, OFFSET_KEY, SOURCE_KEY, Sample
from shardmix.formats.tags import TAG_KEY
from shardmix.policy import Damage, DamageHandler
from shardmix.reading.decode import Decoder
from shardmix.sources.traffic import count_seconds

PROVENANCE_KEYS = (KEY_FIELD, SOURCE_KEY, INDEX_KEY, OFFSET_KEY)

# The key that marks a tombstone, and its two values.
FILTERED = "filtered"
SKIPPED = "skipped"

# The fields a sample that is not a dict travels in (:func:`as_sample`).
VALUE, TUPLE, LIST = "\x00value", "\x00tuple", "\x00list"

_TRANSFORM_STREAM = 0x7A5F  # keeps transform draws apart from other streams of the same seed


@dataclass(frozen=True)
class SampleTransform:
    """Decode, then ``transform(sample)`` (with ``rng``: ``transform(sample, rng)``, seeded per
    record from ``seed``) the records of one shard; picklable, for the workers."""

    transform: Callable[..., Any] | None = None
    decode: Callable[[Sample], Sample] | None = None
    rng: bool = False
    seed: int = 0
    # The first kept sample's kind in this process, and which it was: all must match.
    first: dict[str, tuple[str, str]] = field(default_factory=dict, compare=False, repr=False)

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
        """``samples`` decoded and transformed, a tombstone in place of each one dropped
        (``example``: TFRecord Examples); a record's tag is held back from both, then put back."""
        clock, spent = time.perf_counter, 0.0
        stream = (epoch, epoch_pass, shard_index)  # with the record's index, seeds its rng
        try:
            for sample in samples:
                tag = sample.pop(TAG_KEY, None)
                provenance = {key: sample[key] for key in PROVENANCE_KEYS if key in sample}
                before = clock()
                try:
                    result = self._one(sample, provenance, stream, example)
                except Exception as error:  # noqa: BLE001 - any failure of user code is wrapped
                    wrapped = _wrap(error, sample)
                    if on_damage is None:
                        raise wrapped from error
                    on_damage(Damage(wrapped, sample.get(INDEX_KEY), sample.get(OFFSET_KEY)))
                    result = tombstone(sample, SKIPPED)
                else:
                    result = tombstone(sample, FILTERED) if result is None else self._kept(result)
                spent += clock() - before
                if tag is not None:
                    result[TAG_KEY] = tag
                yield result
        finally:  # counted once per call, not per sample: the counts take a lock
            count_seconds("transform", spent)

    def _one(
        self, sample: Sample, provenance: Sample, stream: tuple[int, int, int], example: bool
    ) -> Any:
        if example and isinstance(self.decode, Decoder):
            sample = self.decode.example(sample)
        elif self.decode is not None:
            sample = self.decode(sample)
        if self.transform is None:
            result: Any = sample
        elif self.rng:
            rng = record_rng(self.seed, *stream, provenance[INDEX_KEY])
            result = self.transform(sample, rng)
        else:
            result = self.transform(sample)
        return None if result is None else as_sample(result, provenance)

    def _kept(self, sample: Sample) -> Sample:
        """``sample``, checked to be one a batch can hold, of the first one's kind."""
        kind = kind_of(sample)
        if kind is None:
            raise self._refused(
                sample,
                "a sample must be what torch's default_collate takes: a dict of fields, a "
                "tuple or list of values, or one tensor, numpy array (of numbers), number, "
                "str or bytes; return one of these (e.g. a tuple (image, label))",
            )
        where = f"the sample with key {sample.get(KEY_FIELD)!r} of {sample.get(SOURCE_KEY)}"
        first_kind, first = self.first.setdefault("kind", (kind, where))
        if kind != first_kind:
            raise self._refused(
                sample,
                f"but {first_kind} for {first}; return the same kind of sample for every record",
            )
        return sample

    def _refused(self, sample: Sample, expected: str) -> TransformError:
        returned = as_returned(sample)
        if isinstance(returned, dict):  # as returned, without the provenance added
            returned = {k: v for k, v in returned.items() if k not in PROVENANCE_KEYS}
        function = "the transform" if self.transform is not None else "the decoder"
        name = _name(self.transform if self.transform is not None else self.decode)
        return _error(
            sample,
            f"{function} {name} returned {type(returned).__name__} {reprlib.repr(returned)} "
            f"for the sample with key {sample.get(KEY_FIELD)!r}; {expected}",
        )


def as_sample(result: Any, provenance: Sample) -> Sample:
    """What the transform returned as a sample dict with ``provenance``."""
    if isinstance(result, dict):
        for key, value in provenance.items():
            result.setdefault(key, value)
        return result
    if isinstance(result, (tuple, list)) and result:
        prefix = TUPLE if isinstance(result, tuple) else LIST
        sample = {f"{prefix}{at}": value for at, value in enumerate(result)}
    else:
        sample = {VALUE: result}
    sample.update(provenance)
    return sample


def as_returned(sample: Sample) -> Any:
    """The sample as the transform returned it (:func:`as_sample` undone)."""
    if not isinstance(sample, dict):
        return sample  # any iterable dataset's
    if VALUE in sample:
        return sample[VALUE]
    for prefix, kind in ((TUPLE, tuple), (LIST, list)):
        if f"{prefix}0" in sample:
            return kind(sample[f"{prefix}{at}"] for at in range(len(structured(sample))))
    return sample


def structured(sample: Sample) -> list[str]:
    """The fields of ``sample`` that hold what the transform returned as other than a dict."""
    return [name for name in sample if name[:1] == "\x00"]


def kind_of(sample: Sample) -> str | None:
    """What kind of sample this is, in words (None: not one a batch can hold)."""
    if VALUE in sample:
        value = sample[VALUE]
        kind = value_kind(value)
        if kind == "other" or (isinstance(value, np.ndarray) and value.dtype.kind in "OSUV"):
            return None
        return f"a single {kind}"
    if f"{TUPLE}0" in sample:
        return f"a tuple of {len(structured(sample))} values"
    if f"{LIST}0" in sample:
        return f"a list of {len(structured(sample))} values"
    return "a dict"


def value_kind(value: Any) -> str:
    """What collates together: numbers with numbers, arrays with arrays, text with text."""
    if isinstance(value, (bool, int, float, np.number)):
        return "number"
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return "array"
    if isinstance(value, (bytes, str)):
        return "text"
    return "other"


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
    dropped[DROPPED_KEY] = kind
    return dropped


def without_tombstones(
    samples: Iterator[Sample], count: Callable[[str], None] | None = None
) -> Iterator[Sample]:
    """The samples that were kept; ``count(kind)`` is called for each one dropped."""
    for sample in samples:
        if DROPPED_KEY not in sample:
            yield sample
        elif count is not None:
            count(sample[DROPPED_KEY])


def samples_as_returned(samples: Iterator[Sample]) -> Iterator[Any]:
    """``samples`` as the transform returned them, without their tags."""
    for sample in samples:
        if isinstance(sample, dict):
            sample.pop(TAG_KEY, None)
        yield as_returned(sample)


def _name(function: Callable[..., Any] | None) -> str:
    qualname = getattr(function, "__qualname__", None)
    if qualname is None:
        return reprlib.repr(function)
    return f"{getattr(function, '__module__', None)}.{qualname}"


def _wrap(error: Exception, sample: Sample) -> TransformError:
    what = "decoding" if isinstance(error, DecodeError) else "the transform"
    return _error(
        sample,
        f"{what} failed on the sample with key {sample.get(KEY_FIELD)!r}: "
        f"{type(error).__name__}: {error}; fix the data or the transform, or pass "
        "on_error='skip' to skip and count such samples",
    )


def _error(sample: Sample, what: str) -> TransformError:
    """A TransformError saying ``what`` went wrong at ``sample``'s shard, record and offset."""
    url = sample.get(SOURCE_KEY) or "<unknown shard>"
    record, offset = sample.get(INDEX_KEY), sample.get(OFFSET_KEY)
    where = describe_position(url, offset=offset, record=record)
    return TransformError(f"{where}: {what}", url=url, offset=offset, record=record)
