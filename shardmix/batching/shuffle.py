"""Shuffle buffer: a seeded reservoir that turns a stream into a locally shuffled stream.

A push past the buffer's limit (:func:`size_limit`: its warm-up, see ``docs/concepts.md``)
displaces a uniformly chosen resident, which is emitted and whose slot the newcomer takes; at
the end the residents leave in random order. The state is the residents in slot order, their
sizes and the draw count; the draws are a counter-based stream of ``(seed, epoch)``, so the
next evictions can be worked out ahead (:func:`eviction_order`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

_SHUFFLE_STREAM = 0x5B0F
_BLOCK = 4096
# Until full, the buffer holds at least 1 / HELD_SHARE of the samples it took in.
HELD_SHARE = 2


def size_limit(arrivals: int, capacity: int, warmup: int) -> int:
    """How many residents a buffer that took in ``arrivals`` samples may hold (see above).

    >>> [size_limit(n, 100, 8) for n in (0, 16, 17, 18, 120, 500)]
    [8, 8, 8, 9, 60, 100]
    """
    return min(capacity, max(warmup, arrivals // HELD_SHARE))


def size_limits(arrivals: np.ndarray, capacity: int, warmup: int) -> np.ndarray:
    """:func:`size_limit` of each of ``arrivals``."""
    return np.minimum(capacity, np.maximum(warmup, arrivals // HELD_SHARE))


def check_sizes(capacity: int, warmup: int | None) -> int:
    """The warm-up, validated (``None``: no warm-up, the buffer emits once full)."""
    if capacity < 0:
        raise ValueError(f"shuffle buffer capacity must be >= 0, got {capacity}")
    if warmup is None:
        return capacity
    if warmup < 1:
        raise ValueError(f"shuffle buffer warm-up must be >= 1 sample, got {warmup}")
    return min(warmup, capacity)


class Draws:
    """The ``n``-th uniform 62-bit integer of the stream ``(seed, epoch)``, for any ``n``."""

    def __init__(self, seed: int, epoch: int) -> None:
        self._key = (_SHUFFLE_STREAM, seed, epoch)
        self._base = -2 * _BLOCK  # the count of the block's first draw: none held yet
        self._block: list[int] = []
        self._arrays: dict[int, np.ndarray] = {}
        self.count = 0

    def below(self, bound: int) -> int:
        """The next draw reduced to ``[0, bound)``."""
        offset = self.count - self._base
        if not 0 <= offset < _BLOCK:
            block_index, offset = divmod(self.count, _BLOCK)
            self._block = self._block_array(block_index).tolist()
            self._base = block_index * _BLOCK
        self.count += 1
        return self._block[offset] % bound

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` draws, unreduced, as int64; the count does not advance."""
        if not count:
            return np.empty(0, dtype=np.int64)
        first = self.count
        blocks = range(first // _BLOCK, (first + count - 1) // _BLOCK + 1)
        parts = [self._block_array(block) for block in blocks]
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        start = first - blocks.start * _BLOCK
        return joined[start : start + count]

    def _block_array(self, block_index: int) -> np.ndarray:
        cached = self._arrays.get(block_index)
        if cached is None:
            rng = np.random.default_rng([*self._key, block_index])
            cached = rng.integers(0, 1 << 62, size=_BLOCK, dtype=np.int64)
            if len(self._arrays) > 2:
                self._arrays.clear()
            self._arrays[block_index] = cached
        return cached

    def fork(self) -> Draws:
        """An independent stream at this one's count: drawing from it leaves this one as is."""
        other = Draws.__new__(Draws)
        other._key, other._base, other._block = self._key, self._base, self._block
        other._arrays = {}
        other.count = self.count
        return other


def eviction_order(
    draws: Draws,
    residents: int,
    steps: int,
    *,
    pushing: bool,
    limit: Callable[[int], int] | None = None,
) -> list[int]:
    """Which of ``residents`` (slots) the next ``steps`` evictions take, in the order they leave.

    With ``pushing`` every step is a push (one that finds room under ``limit(arrivals)``, None:
    never, takes a new slot and no step), else a pop. ``draws`` is not advanced. Exact but for
    the byte budget: a push it holds back takes a draw where none was foreseen.

    >>> draws = Draws(seed=0, epoch=0)
    >>> order = eviction_order(draws, 4, 4, pushing=False)
    >>> sorted(order), draws.count
    ([0, 1, 2, 3], 0)
    """
    ahead = draws.fork()
    slots = list(range(residents))  # -1: a sample pushed since, not a resident
    order: list[int] = []
    taken = 0
    room = limit if pushing and limit is not None else (lambda arrivals: 0)
    # A limit never falls as arrivals grow: once the slots reach its ceiling, no push finds room.
    ceiling = room(sys.maxsize)
    while taken < steps and slots:
        if len(slots) < ceiling and len(slots) < room(len(slots) + ahead.count):
            slots.append(-1)
            continue
        index = ahead.below(len(slots))
        taken += 1
        evicted = slots[index]
        if pushing:
            slots[index] = -1
        else:
            last = slots.pop()
            if index < len(slots):
                slots[index] = last
        if evicted >= 0:
            order.append(evicted)
    return order
