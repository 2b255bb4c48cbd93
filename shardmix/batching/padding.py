"""Padding under several ranks: a rank that runs short repeats its first samples of the epoch.

A rank keeps its first samples as ``(shard, record, offset)`` references while it yields them
and re-reads them when it pads, so the state holds references only (``"pad"``, ``"padded"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardmix.batching.residents import read_refs
from shardmix.errors import ConfigError
from shardmix.formats import Sample
from shardmix.reading.shardreads import ShardReads
from shardmix.state.codec import Ref, check_refs, pack_refs, unpack_refs

__all__ = ["PAD_RESERVE", "Padding", "padding_state"]

# At least this many of the epoch's first samples are kept to pad with (a filter may drop more).
PAD_RESERVE = 1024


def padding_state(refs: list[Ref], padded: int) -> dict[str, Any]:
    """The padding's state: ``{"pad": refs packed, "padded": padded}``."""
    return {"pad": pack_refs(refs), "padded": padded}


class Padding:
    """This rank's samples to pad with, as references, and the samples padded so far."""

    def __init__(self, reads: ShardReads | None, epoch: int, epoch_pass: int) -> None:
        self._reads = reads  # None: not a ShardDataset's epoch, which pads nothing
        self._epoch = epoch
        self._epoch_pass = epoch_pass
        self.refs: list[Ref] = []
        self.padded = 0  # samples repeated to reach the quota
        self._samples: list[Sample] | None = None  # the references, read at the first pad

    def keep(self, refs_of: Callable[[np.ndarray], list[Ref]], ids: np.ndarray, most: int) -> None:
        """Keep the references (``refs_of``) of ``ids``, just yielded, up to ``most`` in all."""
        wanted = most - len(self.refs)
        if wanted > 0:
            self.refs.extend(refs_of(ids[:wanted]))

    def take(self, count: int) -> list[Sample]:
        """The next ``count`` samples to pad with: the kept ones, read now, in turn."""
        pads = [self._sample(self.padded + extra) for extra in range(count)]
        self.padded += count
        return pads

    def _sample(self, position: int) -> Sample:
        if self._samples is None:
            assert self._reads is not None
            self._samples = read_refs(self._reads, self.refs, self._epoch, self._epoch_pass)
        if not self._samples:
            raise ConfigError(f"epoch {self._epoch}: this rank has no records to pad with")
        return dict(self._samples[position % len(self._samples)])

    def state_dict(self) -> dict[str, Any]:
        """The padding's state (:func:`padding_state`)."""
        return padding_state(self.refs, self.padded)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on where :meth:`state_dict` was taken."""
        self.refs = unpack_refs(state["pad"], "pad")
        assert self._reads is not None  # only a ShardDataset's epoch is restored
        check_refs(self.refs, len(self._reads.plan.urls), "pad")
        self.padded = state["padded"]
        self._samples = None
