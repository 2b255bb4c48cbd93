"""Shuffle buffer: a seeded reservoir that turns a stream into a locally shuffled stream.

Once full, every incoming sample displaces a uniformly chosen resident, which is emitted; at
the end the residents leave in random order. Residents are kept in arrival order (the displaced
one is removed, the newcomer appended), so the buffer's state is the list of what it holds, in
the order it arrived, plus the number of random draws made. The draws come from a counter-based
stream, drawn in blocks from ``(seed, epoch, block)``: nothing to pickle, nothing that depends
on time or process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")

_SHUFFLE_STREAM = 0x5B0F
_BLOCK = 4096


class Draws:
    """The ``n``-th uniform 62-bit integer of the stream ``(seed, epoch)``, for any ``n``."""

    def __init__(self, seed: int, epoch: int) -> None:
        self._key = (_SHUFFLE_STREAM, seed, epoch)
        self._block_index = -1
        self._block: list[int] = []
        self.count = 0

    def below(self, bound: int) -> int:
        """The next draw reduced to ``[0, bound)``."""
        block_index, offset = divmod(self.count, _BLOCK)
        if block_index != self._block_index:
            rng = np.random.default_rng([*self._key, block_index])
            self._block = rng.integers(0, 1 << 62, size=_BLOCK, dtype=np.int64).tolist()
            self._block_index = block_index
        self.count += 1
        return self._block[offset] % bound


class ShuffleBuffer(Generic[T]):
    """Holds up to ``capacity`` items; see the module docstring for the order it produces."""

    def __init__(self, capacity: int, *, seed: int, epoch: int) -> None:
        if capacity < 0:
            raise ValueError(f"shuffle buffer capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.items: list[T] = []
        self.draws = Draws(seed, epoch)

    def push(self, item: T) -> T | None:
        """Add ``item``; once full, return the resident it displaced (else ``None``)."""
        if len(self.items) < self.capacity:
            self.items.append(item)
            return None
        if self.capacity == 0:
            return item
        evicted = self.items.pop(self.draws.below(self.capacity))
        self.items.append(item)
        return evicted

    def pop(self) -> T | None:
        """Remove and return a uniformly chosen resident; ``None`` when empty."""
        if not self.items:
            return None
        return self.items.pop(self.draws.below(len(self.items)))

    def drain(self) -> Iterator[T]:
        """Emit the residents in random order, emptying the buffer."""
        while self.items:
            yield self.items.pop(self.draws.below(len(self.items)))


def shuffled(items: Iterator[T], capacity: int, *, seed: int, epoch: int) -> Iterator[T]:
    """``items`` passed through a :class:`ShuffleBuffer` of ``capacity``."""
    buffer: ShuffleBuffer[T] = ShuffleBuffer(capacity, seed=seed, epoch=epoch)
    for item in items:
        evicted = buffer.push(item)
        if evicted is not None:
            yield evicted
    yield from buffer.drain()
