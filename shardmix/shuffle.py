"""Shuffle buffer: a seeded reservoir that turns a stream into a locally shuffled stream.

Once full, every incoming sample displaces a uniformly chosen resident, which is emitted; at
the end the residents leave in random order. Residents sit in slots and eviction swaps, so each
step costs O(1) whatever the capacity: a newcomer takes the slot of the resident it displaces,
and a pop (at the end) takes a uniformly chosen slot's resident and moves the last slot's
resident into it.

The buffer emits before it is full (its *warm-up*), so that a first batch does not wait for
thousands of samples: a push finds room only while the buffer holds fewer than its *limit*,
``min(capacity, max(warmup, arrivals // 2))`` (:func:`size_limit`), ``arrivals`` being the
pushes so far; any other push displaces a resident. The buffer so fills to ``warmup`` samples
(a few batches) without emitting, emits one sample per push until it took in ``2 * warmup``,
then one per two pushes, holding half of all it took in, until it is full, and one per push
from then on. Until it is full, a sample leaves a buffer that holds at least half of what came
before it, drawn uniformly among them.

The buffer's state is the list of what it holds, in slot order, plus the number of random draws
made. ``arrivals`` needs no field of its own: every push takes a slot or makes one draw and
every pop frees a slot with one draw, so it is the number held plus the draw count. The draws
come from a counter-based stream, drawn in blocks from ``(seed, epoch, block)``: nothing to
pickle, nothing that depends on time or process, and which residents the next evictions take
can be worked out ahead (:func:`eviction_order`), which is how a restore reads first the
residents it needs first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")

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


def _size_limits(arrivals: np.ndarray, capacity: int, warmup: int) -> np.ndarray:
    """:func:`size_limit` of each of ``arrivals``."""
    return np.minimum(capacity, np.maximum(warmup, arrivals // HELD_SHARE))


def _check_sizes(capacity: int, warmup: int | None) -> int:
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

    It emits from ``warmup`` items on (None: only once full), as the module says. With
    ``max_bytes`` (and ``size_of``, an item's size), the buffer stops growing once its
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
        warmup: int | None = None,
    ) -> None:
        self.warmup = _check_sizes(capacity, warmup)
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

    @property
    def arrivals(self) -> int:
        """The pushes so far: each took a slot or made a draw, each pop freed one with one."""
        return len(self.items) + self.draws.count

    def limit(self, arrivals: int) -> int:
        """How many residents the buffer may hold once it took in ``arrivals`` (a capacity-0
        buffer passes items through without a draw, but its limit stays 0)."""
        return size_limit(arrivals, self.capacity, self.warmup)

    def push(self, item: T, size: int | None = None) -> T | None:
        """Add ``item``; return the resident it displaced, if it found no room (else ``None``).

        ``size`` is the item's size when the caller knows it (else ``size_of`` tells).
        """
        items = self.items
        limit = self.limit(self.arrivals)
        if self._size_of is None:
            if len(items) < limit:
                items.append(item)
                return None
            if not items:  # capacity 0
                return item
            index = self.draws.below(len(items))
            evicted = items[index]
            items[index] = item  # the newcomer takes the evicted resident's slot
            return evicted
        if size is None:
            size = self._size_of(item)
        if len(items) < limit and (not items or self.bytes + size <= self.max_bytes):  # type: ignore[operator]
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
    draws, slots, warm-up and byte budget), but a run of pushes costs a few numpy calls, not a
    step per item: which pushes of the run find room follows from the limit alone (until the
    byte budget says otherwise, where the run is cut), a push that finds room takes a new slot,
    one that displaces lands in the slot its draw names, and the id it displaces is the slot's
    resident or, if an earlier push of the run wrote that slot, that push's id. Ids below 0 are
    the caller's to interpret (a restore's residents).
    """

    def __init__(
        self, capacity: int, *, seed: int, epoch: int, max_bytes: int | None, warmup: int | None
    ) -> None:
        self.warmup = _check_sizes(capacity, warmup)
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.draws = Draws(seed, epoch)
        # The slots live in arrays with room to grow into: a run that appends writes in place
        # instead of copying every resident (thousands) once per batch.
        self._ids = np.empty(0, dtype=np.int64)
        self._sizes = np.empty(0, dtype=np.int64)
        self._length = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self._length

    @property
    def slots(self) -> np.ndarray:
        """The residents' ids, in slot order (a view: read it before the next push or pop)."""
        return self._ids[: self._length]

    @property
    def sizes(self) -> np.ndarray:
        """The residents' sizes, in slot order (a view, as :attr:`slots`)."""
        return self._sizes[: self._length]

    @property
    def arrivals(self) -> int:
        """The pushes so far: each took a slot or made a draw, each pop freed one with one."""
        return self._length + self.draws.count

    def limit(self, arrivals: int) -> int:
        """How many residents the buffer may hold once it took in ``arrivals`` samples."""
        return size_limit(arrivals, self.capacity, self.warmup)

    def restore(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        """Hold ``ids`` (in slot order) of ``sizes`` bytes."""
        self._ids = np.asarray(ids, dtype=np.int64).copy()
        self._sizes = np.asarray(sizes, dtype=np.int64).copy()
        self._length = len(self._ids)
        self.bytes = int(self._sizes.sum())

    def _make_room(self, count: int) -> None:
        """Have the arrays hold ``count`` slots past the residents (doubling, not one by one)."""
        need = self._length + count
        if need <= len(self._ids):
            return
        size = max(need, 2 * len(self._ids), 64)
        for name in ("_ids", "_sizes"):
            grown = np.empty(size, dtype=np.int64)
            grown[: self._length] = getattr(self, name)[: self._length]
            setattr(self, name, grown)

    def pushes_for(self, evictions: int) -> int:
        """How many pushes displace ``evictions`` residents (exact without a byte budget,
        which may make it more): what to read ahead for the next ``evictions`` samples."""
        if not evictions:
            return 0
        if not self.limit(self.arrivals) or len(self) >= self.capacity:
            return evictions  # capacity 0 (every push passes through), or full
        behind = max(0, self.limit(self.arrivals) - len(self))
        count = HELD_SHARE * (evictions + behind) + 2
        displaced = np.cumsum(~self._rooms(count))
        return int(np.searchsorted(displaced, evictions)) + 1

    def _held(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(held, limits)`` before each of the next ``count`` pushes, none cut by bytes.

        A push finds room while the buffer holds less than its limit, and the limit grows by
        at most one per push: the buffer takes every push until it holds its limit (at once,
        if it holds that many or more), then follows the limit as it grows.
        """
        arrivals, held = self.arrivals, len(self)
        if held >= self.capacity:  # full: no push finds room
            return np.full(count, held), np.full(count, self.capacity)
        steps = np.arange(count + 1)
        limits = _size_limits(arrivals + steps, self.capacity, self.warmup)
        reached = held + steps >= limits
        caught = int(np.argmax(reached)) if reached.any() else count + 1
        before = np.concatenate(([held], np.maximum(held + caught, limits[:-1])))[:-1]
        sizes = np.where(steps[:-1] <= caught, held + steps[:-1], before)
        return sizes, limits[:-1]

    def _rooms(self, count: int) -> np.ndarray:
        """Which of the next ``count`` pushes find room, none cut by bytes."""
        held, limits = self._held(count)
        return held < limits

    def push(self, ids: np.ndarray, sizes: np.ndarray, evictions: int) -> tuple[np.ndarray, int]:
        """Push ``ids`` in order until ``evictions`` residents were displaced, or all are in.

        Returns the displaced ids, in order, and how many of ``ids`` went in.
        """
        out: list[np.ndarray] = []
        done = evicted = 0
        total = len(ids)
        while done < total and evicted < evictions:
            if not self.limit(self.arrivals):  # capacity 0: the item passes straight through
                out.append(ids[done : done + 1])
                done += 1
                evicted += 1
                continue
            most = evictions - evicted
            count = min(total - done, self.pushes_for(most))
            run, used = self._run(ids[done : done + count], sizes[done : done + count], most)
            out.append(run)
            done += used
            evicted += len(run)
        if not out:
            return np.empty(0, dtype=np.int64), done
        return (out[0] if len(out) == 1 else np.concatenate(out)), done

    def _run(self, ids: np.ndarray, sizes: np.ndarray, most: int) -> tuple[np.ndarray, int]:
        """Push ``ids``, or the first of them: up to ``most`` displacements, and up to where
        the byte budget changes which pushes find room; the displaced ids and how many of
        ``ids`` went in."""
        count = len(ids)
        if len(self) >= self.capacity:  # full: every push displaces, whatever the bytes
            count = min(count, most)
            return self._displace(ids[:count], sizes[:count]), count
        held, limits = self._held(count)
        rooms = held < limits
        budget = self.max_bytes
        if budget is not None and rooms[0] and held[0] and self.bytes + sizes[0] > budget:
            # Held back by bytes, not by the limit: pushes displace until bytes free up.
            held, rooms = np.full(count, len(self)), np.zeros(count, dtype=bool)
        pushed = ~rooms
        displaced = np.cumsum(pushed)
        if displaced[-1] > most:
            count = int(np.searchsorted(displaced, most)) + 1
            ids, sizes, held, limits = ids[:count], sizes[:count], held[:count], limits[:count]
            rooms, pushed = rooms[:count], pushed[:count]
        slots = held.copy()  # a push that finds room takes a new slot at the end
        draws = int(pushed.sum())
        slots[pushed] = self.draws.take(draws) % held[pushed]
        appended = count - draws
        self._make_room(appended)
        out_ids, out_sizes, last = self._chain(slots, ids, sizes)
        out_sizes[rooms] = 0
        if budget is not None and (held < limits).any():
            # Bytes held before each push: the first push whose choice they change ends the
            # run before it (none can where the limit alone leaves no room).
            change = np.cumsum(sizes - out_sizes)
            bytes_before = self.bytes + np.concatenate(([0], change[:-1]))
            fits = (held == 0) | (bytes_before + sizes <= budget)
            wrong = rooms != ((held < limits) & fits)
            if wrong.any():
                cut = int(np.argmax(wrong))
                return self._run(ids[:cut], sizes[:cut], most)
        self._keep(slots, ids, sizes, last, out_sizes, draws)
        self._length += appended
        return out_ids[pushed], count

    def _displace(self, ids: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Push ``ids`` into the full buffer, each displacing a resident; the displaced ids."""
        slots = self.draws.take(len(ids)) % len(self)
        out_ids, out_sizes, last = self._chain(slots, ids, sizes)
        self._keep(slots, ids, sizes, last, out_sizes, len(ids))
        return out_ids

    def _chain(
        self, slots: np.ndarray, ids: np.ndarray, sizes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For a run of pushes that write ``slots``: the id and size each finds there (the
        resident, or what an earlier push of the run wrote), and which push writes each slot
        last. A slot past the residents is read only by a push that an earlier one (the
        append that made it) wrote before: what the array holds there does not matter."""
        count = len(slots)
        order = np.argsort(slots, kind="stable")
        ordered = slots[order]
        same = ordered[1:] == ordered[:-1]
        before = np.full(count, -1, dtype=np.int64)
        before[order[1:][same]] = order[:-1][same]
        chained = before >= 0
        out_ids = self._ids[slots]
        out_sizes = self._sizes[slots]
        out_ids[chained] = ids[before[chained]]
        out_sizes[chained] = sizes[before[chained]]
        last = np.ones(count, dtype=bool)
        last[order[:-1][same]] = False
        return out_ids, out_sizes, last

    def _keep(
        self,
        slots: np.ndarray,
        ids: np.ndarray,
        sizes: np.ndarray,
        last: np.ndarray,
        out_sizes: np.ndarray,
        draws: int,
    ) -> None:
        """Write a run: each slot keeps the last push of the run that wrote it."""
        self.draws.count += draws
        self._ids[slots[last]] = ids[last]
        self._sizes[slots[last]] = sizes[last]
        self.bytes += int(sizes.sum() - out_sizes.sum())

    def pop(self, count: int) -> np.ndarray:
        """Remove up to ``count`` residents, each uniformly chosen; the last slot's resident
        moves into the emptied slot (as :meth:`ShuffleBuffer.pop`)."""
        held = self._length
        count = min(count, held)
        # Only the popped slots and the last ``count`` (which move into them) change, so the
        # loop runs on those: the tail as lists, the rest of the slots through ``moved``.
        kept = held - count
        tail = self._ids[kept:held].tolist()
        tail_sizes = self._sizes[kept:held].tolist()
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
                int(self._ids[index]),
                int(self._sizes[index]),
            )
            out.append(held_id)
            self.bytes -= held_size
            moved[index] = (last, last_size)
        self.draws.count += count
        self._length = kept
        if moved:
            where = np.fromiter(moved, dtype=np.int64, count=len(moved))
            values = np.array(list(moved.values()), dtype=np.int64)
            self._ids[where] = values[:, 0]
            self._sizes[where] = values[:, 1]
        return np.asarray(out, dtype=np.int64)


def eviction_order(
    draws: Draws,
    residents: int,
    steps: int,
    *,
    pushing: bool,
    limit: Callable[[int], int] | None = None,
) -> list[int]:
    """Which of ``residents`` (slots) the next ``steps`` evictions take.

    In the order they leave, each once; those not taken within ``steps`` are left out. With
    ``pushing``, every step is a push; one that finds room under ``limit(arrivals)`` (the
    buffer's :meth:`SlotBuffer.limit`; None: no push finds room) takes a new slot and no
    step, any other displaces a resident. Else every step is a pop, as at the epoch's end.
    ``draws`` is not advanced. The prediction is exact but for the byte budget: a push it
    holds back takes a draw where none was foreseen, and shifts the rest.

    >>> buffer = ShuffleBuffer(4, seed=0, epoch=0)
    >>> buffer.restore(["a", "b", "c", "d"])
    >>> order = eviction_order(buffer.draws, 4, 4, pushing=False)
    >>> [buffer.items[position] for position in order] == list(buffer.drain())
    True
    """
    ahead = draws.fork()
    slots = list(range(residents))  # -1: a sample pushed since, not a resident
    order: list[int] = []
    taken = 0
    while taken < steps and slots:
        if pushing and limit is not None and len(slots) < limit(len(slots) + ahead.count):
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


def shuffled(
    items: Iterator[T], capacity: int, *, seed: int, epoch: int, warmup: int | None = None
) -> Iterator[T]:
    """``items`` passed through a :class:`ShuffleBuffer` of ``capacity`` and ``warmup``."""
    buffer: ShuffleBuffer[T] = ShuffleBuffer(capacity, seed=seed, epoch=epoch, warmup=warmup)
    for item in items:
        evicted = buffer.push(item)
        if evicted is not None:
            yield evicted
    yield from buffer.drain()
