"""Shuffle buffer: a seeded reservoir that turns a stream into a locally shuffled stream.

Once full, every incoming sample displaces a uniformly chosen resident, which is emitted; at
the end the residents leave in random order. Residents sit in slots and eviction swaps, so each
step costs O(1) whatever the capacity: a newcomer takes the slot of the resident it displaces,
and a pop (at the end) takes a uniformly chosen slot's resident and moves the last slot's
resident into it. The buffer's state is the list of what it holds, in slot order, plus the
number of random draws made. The draws come from a counter-based
stream, drawn in blocks from ``(seed, epoch, block)``: nothing to pickle, nothing that depends
on time or process, and which residents the next evictions take can be worked out ahead
(:func:`eviction_order`), which is how a restore reads first the residents it needs first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")

_SHUFFLE_STREAM = 0x5B0F
_BLOCK = 4096


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
        """The next ``count`` draws, unreduced, as int64 (the same as ``count`` calls would
        reduce); the count advances only by what :meth:`advance` says was used."""
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


class ShuffleBuffer(Generic[T]):
    """Holds up to ``capacity`` items, and about ``max_bytes`` of them when given.

    With ``max_bytes`` (and ``size_of``, an item's size), the buffer stops growing once its
    items hold that many bytes: from then on every push displaces a resident, as when it is
    full. The order it produces is therefore a function of the items' sizes too, which are a
    function of the data; it does not depend on anything else.
    """

    def __init__(
        self,
        capacity: int,
        *,
        seed: int,
        epoch: int,
        max_bytes: int | None = None,
        size_of: Callable[[T], int] | None = None,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"shuffle buffer capacity must be >= 0, got {capacity}")
        if max_bytes is not None and size_of is None:
            raise ValueError("a byte budget (max_bytes) needs size_of")
        self.capacity = capacity
        self.items: list[T] = []
        self.draws = Draws(seed, epoch)
        self.max_bytes = max_bytes
        self._size_of = size_of if max_bytes is not None else None
        self._sizes: list[int] = []
        self.bytes = 0

    def restore(self, items: list[T]) -> None:
        """Hold ``items`` (a checkpoint's residents, in slot order)."""
        self.items = list(items)
        if self._size_of is not None:
            self._sizes = [self._size_of(item) for item in self.items]
            self.bytes = sum(self._sizes)

    def sizes(self) -> list[int]:
        """Each resident's size, in slot order, as the byte budget counts it (0 without)."""
        return list(self._sizes) if self._size_of is not None else [0] * len(self.items)

    def push(self, item: T, size: int | None = None) -> T | None:
        """Add ``item``; once full, return the resident it displaced (else ``None``).

        ``size`` is the item's size when the caller knows it (else ``size_of`` tells).
        """
        items = self.items
        if self._size_of is None:
            if len(items) < self.capacity:
                items.append(item)
                return None
            if self.capacity == 0:
                return item
            index = self.draws.below(self.capacity)
            evicted = items[index]
            items[index] = item  # the newcomer takes the evicted resident's slot
            return evicted
        if size is None:
            size = self._size_of(item)
        if len(items) < self.capacity and (not items or self.bytes + size <= self.max_bytes):  # type: ignore[operator]
            items.append(item)
            self._sizes.append(size)
            self.bytes += size
            return None
        if not items:
            return item
        index = self.draws.below(len(items))
        evicted = items[index]
        self.bytes += size - self._sizes[index]
        items[index] = item
        self._sizes[index] = size
        return evicted

    def pop(self) -> T | None:
        """Remove and return a uniformly chosen resident; ``None`` when empty.

        The last slot's resident moves into the emptied slot.
        """
        items = self.items
        if not items:
            return None
        index = self.draws.below(len(items))
        last = items.pop()
        if self._sizes:
            last_size = self._sizes.pop()
            if index < len(items):
                self.bytes -= self._sizes[index]
                self._sizes[index] = last_size
            else:
                self.bytes -= last_size
        if index < len(items):
            evicted, items[index] = items[index], last
            return evicted
        return last

    def drain(self) -> Iterator[T]:
        """Emit the residents in random order, emptying the buffer."""
        while self.items:
            yield self.pop()  # type: ignore[misc]


class SlotBuffer:
    """A :class:`ShuffleBuffer` of integer ids that takes and gives them in arrays.

    It makes exactly the choices a ShuffleBuffer makes for the same pushes and pops (the same
    draws, slots and byte budget), but a run of pushes that each displace a resident costs a
    few numpy calls, not a step per item: a push lands in the slot its draw names, and the id
    it displaces is the slot's resident or, if an earlier push of the run landed there, that
    push's id. Ids below 0 are the caller's to interpret (a restore's residents).
    """

    def __init__(self, capacity: int, *, seed: int, epoch: int, max_bytes: int | None) -> None:
        if capacity < 0:
            raise ValueError(f"shuffle buffer capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.draws = Draws(seed, epoch)
        self.slots = np.empty(0, dtype=np.int64)
        self.sizes = np.empty(0, dtype=np.int64)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.slots)

    def restore(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        """Hold ``ids`` (in slot order) of ``sizes`` bytes."""
        self.slots = np.asarray(ids, dtype=np.int64).copy()
        self.sizes = np.asarray(sizes, dtype=np.int64).copy()
        self.bytes = int(self.sizes.sum())

    def push(self, ids: np.ndarray, sizes: np.ndarray, evictions: int) -> tuple[np.ndarray, int]:
        """Push ``ids`` in order until ``evictions`` residents were displaced, or all are in.

        Returns the displaced ids, in order, and how many of ``ids`` went in.
        """
        out: list[np.ndarray] = []
        done = evicted = 0
        total = len(ids)
        while done < total and evicted < evictions:
            room = self._room(sizes[done:])
            if room:
                self._append(ids[done : done + room], sizes[done : done + room])
                done += room
                continue
            if not len(self.slots):  # capacity 0: the item passes straight through
                out.append(ids[done : done + 1])
                done += 1
                evicted += 1
                continue
            run = self._displace(ids[done:], sizes[done:], evictions - evicted)
            out.append(run)
            done += len(run)
            evicted += len(run)
        if not out:
            return np.empty(0, dtype=np.int64), done
        return (out[0] if len(out) == 1 else np.concatenate(out)), done

    def _room(self, sizes: np.ndarray) -> int:
        """How many of the next pushes would find room (each as ShuffleBuffer.push decides)."""
        free = self.capacity - len(self.slots)
        if free <= 0:
            return 0
        ahead = sizes[:free]
        if self.max_bytes is None:
            return len(ahead)
        fits = self.bytes + np.cumsum(ahead) <= self.max_bytes
        if not len(self.slots):
            fits[0] = True  # an empty buffer takes one item, whatever its size
        return len(ahead) if fits.all() else int(np.argmin(fits))

    def _append(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        self.slots = np.concatenate((self.slots, ids))
        self.sizes = np.concatenate((self.sizes, sizes))
        self.bytes += int(sizes.sum())

    def _displace(self, ids: np.ndarray, sizes: np.ndarray, most: int) -> np.ndarray:
        """Push a run of ids that each displace a resident; the displaced ids.

        The run stops after ``most`` pushes, or before the first push that would find room
        again (under the byte budget, once displaced residents were larger than newcomers).
        """
        held = len(self.slots)
        count = min(len(ids), most)
        ids, sizes = ids[:count], sizes[:count]
        slots = self.draws.take(count) % held
        # The push before each one that landed in the same slot, or -1.
        order = np.argsort(slots, kind="stable")
        ordered = slots[order]
        same = ordered[1:] == ordered[:-1]
        before = np.full(count, -1, dtype=np.int64)
        before[order[1:][same]] = order[:-1][same]
        chained = before >= 0
        out_ids = self.slots[slots]
        out_sizes = self.sizes[slots]
        out_ids[chained] = ids[before[chained]]
        out_sizes[chained] = sizes[before[chained]]
        if self.max_bytes is not None and held < self.capacity:
            # Bytes held before each push; the first that finds room ends the run before it.
            change = np.cumsum(sizes - out_sizes)
            held_before = self.bytes + np.concatenate(([0], change[:-1]))
            roomy = held_before + sizes <= self.max_bytes
            roomy[0] = False  # the caller found no room for the first
            if roomy.any():
                count = int(np.argmax(roomy))
                return self._displace(ids[:count], sizes[:count], count)
        self.draws.count += count
        # Each slot keeps the last push of the run that landed in it.
        last = np.ones(count, dtype=bool)
        last[order[:-1][same]] = False
        self.slots[slots[last]] = ids[last]
        self.sizes[slots[last]] = sizes[last]
        self.bytes += int(sizes.sum() - out_sizes.sum())
        return out_ids

    def pop(self, count: int) -> np.ndarray:
        """Remove up to ``count`` residents, each uniformly chosen; the last slot's resident
        moves into the emptied slot (as :meth:`ShuffleBuffer.pop`)."""
        held = len(self.slots)
        count = min(count, held)
        # Only the popped slots and the last ``count`` (which move into them) change, so the
        # loop runs on those: the tail as lists, the rest of the slots through ``moved``.
        kept = held - count
        tail = self.slots[kept:].tolist()
        tail_sizes = self.sizes[kept:].tolist()
        moved: dict[int, tuple[int, int]] = {}  # slot below ``kept`` -> (id, size) now in it
        out = []
        for draw in self.draws.take(count).tolist():
            index = draw % (kept + len(tail))
            last, last_size = tail.pop(), tail_sizes.pop()
            if index >= kept + len(tail):
                out.append(last)
                self.bytes -= last_size
                continue
            if index >= kept:
                out.append(tail[index - kept])
                self.bytes -= tail_sizes[index - kept]
                tail[index - kept], tail_sizes[index - kept] = last, last_size
                continue
            held_id, held_size = moved.get(index) or (
                int(self.slots[index]),
                int(self.sizes[index]),
            )
            out.append(held_id)
            self.bytes -= held_size
            moved[index] = (last, last_size)
        self.draws.count += count
        self.slots = self.slots[:kept].copy()
        self.sizes = self.sizes[:kept].copy()
        if moved:
            where = np.fromiter(moved, dtype=np.int64, count=len(moved))
            values = np.array(list(moved.values()), dtype=np.int64)
            self.slots[where] = values[:, 0]
            self.sizes[where] = values[:, 1]
        return np.asarray(out, dtype=np.int64)


def eviction_order(draws: Draws, residents: int, steps: int, *, pushing: bool) -> list[int]:
    """Which of ``residents`` (slots) the next ``steps`` evictions take.

    In the order they leave, each once; those not taken within ``steps`` are left out. With
    ``pushing``, every step is a push that displaces a resident (the buffer stays full, as it
    is from when it first fills until the epoch's end); else every step is a pop, as at the
    epoch's end. ``draws`` is not advanced. The prediction is exact while the buffer behaves
    so; a push that finds room (under the byte budget) takes no draw and shifts it.

    >>> buffer = ShuffleBuffer(4, seed=0, epoch=0)
    >>> buffer.restore(["a", "b", "c", "d"])
    >>> order = eviction_order(buffer.draws, 4, 4, pushing=False)
    >>> [buffer.items[position] for position in order] == list(buffer.drain())
    True
    """
    ahead = draws.fork()
    slots = list(range(residents))  # -1: a sample pushed since, not a resident
    order = []
    for _ in range(steps):
        if not slots:
            break
        index = ahead.below(len(slots))
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


def shuffled(items: Iterator[T], capacity: int, *, seed: int, epoch: int) -> Iterator[T]:
    """``items`` passed through a :class:`ShuffleBuffer` of ``capacity``."""
    buffer: ShuffleBuffer[T] = ShuffleBuffer(capacity, seed=seed, epoch=epoch)
    for item in items:
        evicted = buffer.push(item)
        if evicted is not None:
            yield evicted
    yield from buffer.drain()
