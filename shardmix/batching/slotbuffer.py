"""The shuffle buffer the loader uses (:mod:`shardmix.batching.shuffle`'s choices) on arrays of ids.

It takes and gives ids in arrays, a run of pushes in a few numpy calls, and makes exactly the
choices of the one-item-at-a-time reference model the tests hold
(tests/batching/reference_shuffle.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardmix.batching.shuffle import HELD_SHARE, Draws, check_sizes, size_limit, size_limits

__all__ = ["SlotBuffer"]


class SlotBuffer:
    """A shuffle buffer of integer ids that takes and gives them in arrays.

    Which pushes of a run find room follows from the limit alone (until the byte budget says
    otherwise, where the run is cut); a push that displaces takes its draw's slot, and the id
    there: the resident's, or that of an earlier push of the run that wrote the slot."""

    def __init__(
        self, capacity: int, *, seed: int, epoch: int, max_bytes: int | None, warmup: int | None
    ) -> None:
        self.warmup = check_sizes(capacity, warmup)
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

    def state_dict(self) -> dict[str, Any]:
        """``{"draws": the draw count, "slots": the ids in slot order, "sizes": theirs}``."""
        return {
            "draws": self.draws.count,
            "slots": self.slots.tolist(),
            "sizes": self.sizes.tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on where :meth:`state_dict` was taken."""
        self._ids = np.array(state["slots"], dtype=np.int64)
        self._sizes = np.array(state["sizes"], dtype=np.int64)
        self._length = len(self._ids)
        self.bytes = int(self._sizes.sum())
        self.draws.count = state["draws"]

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
        held, limits = self._held(count)
        displaced = np.cumsum(held >= limits)
        return int(np.searchsorted(displaced, evictions)) + 1

    def _held(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(held, limits)`` before each of the next ``count`` pushes, none cut by bytes: the
        buffer takes every push until it holds its limit, then follows the limit as it grows
        (by at most one per push)."""
        arrivals, held = self.arrivals, len(self)
        if held >= self.capacity:  # full: no push finds room
            return np.full(count, held), np.full(count, self.capacity)
        steps = np.arange(count + 1)
        limits = size_limits(arrivals + steps, self.capacity, self.warmup)
        reached = held + steps >= limits
        caught = int(np.argmax(reached)) if reached.any() else count + 1
        before = np.concatenate(([held], np.maximum(held + caught, limits[:-1])))[:-1]
        sizes = np.where(steps[:-1] <= caught, held + steps[:-1], before)
        return sizes, limits[:-1]

    def push(self, ids: np.ndarray, sizes: np.ndarray, evictions: int) -> tuple[np.ndarray, int]:
        """Push ``ids`` in order until ``evictions`` residents were displaced, or all are in;
        the displaced ids, and how many of ``ids`` went in."""
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
        return (np.concatenate(out) if out else np.empty(0, dtype=np.int64)), done

    def _run(self, ids: np.ndarray, sizes: np.ndarray, most: int) -> tuple[np.ndarray, int]:
        """:meth:`push` of a run: up to ``most`` displacements, and up to where the byte budget
        changes which pushes find room."""
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
        last."""
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
        """Remove up to ``count`` residents, each uniformly chosen (the last takes its slot)."""
        held = self._length
        count = min(count, held)
        kept = held - count
        # The k-th pop draws among the first ``held - k`` slots. The loop follows which slot's
        # first resident each changed slot holds (``moved``), so that it handles plain ints
        # only; the ids and sizes are gathered once, before the residents moved are written.
        draws = self.draws.take(count) % np.arange(held, kept, -1, dtype=np.int64)
        moved: dict[int, int] = {}  # slot -> the slot whose resident it holds now
        taken, came = moved.pop, moved.get
        out = []
        for last, index in zip(range(held - 1, kept - 1, -1), draws.tolist(), strict=True):
            resident = taken(last, last)  # what the last slot holds leaves it
            if index == last:
                out.append(resident)
            else:
                out.append(came(index, index))
                moved[index] = resident
        self.draws.count += count
        self._length = kept
        slots = np.asarray(out, dtype=np.int64)
        popped = self._ids[slots]
        self.bytes -= int(self._sizes[slots].sum())
        if moved:  # every slot left in it is below ``kept``; what it holds came from above
            where = np.fromiter(moved, dtype=np.int64, count=len(moved))
            sources = np.fromiter(moved.values(), dtype=np.int64, count=len(moved))
            self._ids[where] = self._ids[sources]
            self._sizes[where] = self._sizes[sources]
        return popped
