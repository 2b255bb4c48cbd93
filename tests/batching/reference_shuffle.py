"""The shuffle buffer's reference model: one item at a time, the choices written plainly.

:class:`~shardmix.batching.slotbuffer.SlotBuffer`, which the loader uses, must make exactly the
choices this model makes (tests/batching/test_shuffle.py and test_batch_definition.py check it):
a push past the buffer's limit displaces a uniformly chosen resident (the newcomer takes its
slot), a pop takes a uniformly chosen resident (the last one moves into its slot), and every
choice is the next draw of :class:`~shardmix.batching.shuffle.Draws`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from shardmix.batching.shuffle import Draws, check_sizes, size_limit

T = TypeVar("T")


class ShuffleBuffer(Generic[T]):
    """Holds up to ``capacity`` items, emitting from ``warmup`` on (None: once full); with
    ``max_bytes`` (and ``size_of``) it stops growing once its items hold that many bytes, so
    the order depends on the items' sizes too."""

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
        self.warmup = check_sizes(capacity, warmup)
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

    def state_dict(self) -> dict[str, Any]:
        """``{"draws": the draw count, "slots": the residents in slot order, "sizes": theirs}``."""
        return {"draws": self.draws.count, "slots": list(self.items), "sizes": self.sizes()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on where :meth:`state_dict` was taken (the sizes are ``size_of``'s again)."""
        self.restore(list(state["slots"]))
        self.draws.count = state["draws"]

    def sizes(self) -> list[int]:
        """Each resident's size, in slot order, as the byte budget counts it (0 without)."""
        return list(self._sizes) if self._size_of is not None else [0] * len(self.items)

    @property
    def arrivals(self) -> int:
        """The pushes so far: each took a slot or made a draw, each pop freed one with one."""
        return len(self.items) + self.draws.count

    def limit(self, arrivals: int) -> int:
        """How many residents the buffer may hold once it took in ``arrivals``."""
        return size_limit(arrivals, self.capacity, self.warmup)

    def push(self, item: T, size: int | None = None) -> T | None:
        """Add ``item`` (of ``size``, else ``size_of``'s); return the resident it displaced,
        if it found no room (else ``None``)."""
        items = self.items
        budget = self.max_bytes  # with it, size_of (see __init__)
        if size is None:
            size = self._size_of(item) if self._size_of is not None else 0
        if len(items) < self.limit(self.arrivals) and (
            budget is None or not items or self.bytes + size <= budget
        ):
            items.append(item)
            if budget is not None:
                self._sizes.append(size)
                self.bytes += size
            return None
        if not items:  # capacity 0
            return item
        index = self.draws.below(len(items))
        evicted = items[index]
        items[index] = item  # the newcomer takes the evicted resident's slot
        if budget is not None:
            self.bytes += size - self._sizes[index]
            self._sizes[index] = size
        return evicted

    def pop(self) -> T | None:
        """Remove and return a uniformly chosen resident; ``None`` when empty."""
        return self._take() if self.items else None

    def _take(self) -> T:
        """Remove and return a uniformly chosen resident of a buffer that holds one."""
        items = self.items
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
            yield self._take()


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
