"""Where an epoch ends under several ranks when the transform filters (or damage is skipped).

The ranks agree on the end as they go: every rank yields the ``min`` of the kept counts
(``drop``, the rest counted as undelivered) or the ``max`` (``pad``). A :class:`RankEnd` runs
without talking up to a *horizon* every rank surely reaches, then exchanges each rank's
``(certain, ended)`` (:func:`~shardmix.world.end_exchange`). Where no rank can agree (simulated
ranks, a resized phase), a drop is refused. See ``docs/design/batching.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from shardmix.errors import ConfigError
from shardmix.plan.kept import Exchange
from shardmix.plan.sharding import EvenRanks
from shardmix.reading.transforms import FILTERED

if TYPE_CHECKING:
    from shardmix.batching.mixing import LaneMerge
    from shardmix.batching.rows import RowStore
    from shardmix.batching.slotbuffer import SlotBuffer

# ``lookahead(count)``: ``(certain, ended)`` of this rank, having looked ``count`` samples on.
Lookahead = Callable[[int], tuple[int, bool]]


class RankEnd:
    """The samples every rank yields this epoch, agreed with the other ranks as they near it;
    ``emitted``: what a resumed epoch already yielded, where the first exchange is due."""

    def __init__(self, exchange: Exchange, even_ranks: EvenRanks, emitted: int = 0) -> None:
        self._exchange = exchange
        self.even_ranks = even_ranks
        self.horizon = emitted
        self.final: int | None = None
        self.exchanges = 0

    def room(self, emitted: int, count: int, lookahead: Lookahead) -> int:
        """How many of the next ``count`` samples this rank yields, having yielded ``emitted``
        (an exchange first when they would pass the horizon)."""
        if self.final is None and emitted + count > self.horizon:
            self._agree(*lookahead(count))
        if self.final is None:
            return count
        return max(0, min(count, self.final - emitted))

    def over(self, emitted: int) -> bool:
        """Whether the epoch's last sample was yielded."""
        return self.final is not None and emitted >= self.final

    def _agree(self, certain: int, ended: bool) -> None:
        """Share ``(certain, ended)``; fix the end once the kept counts decide it (each
        exchange moves the horizon past the count asked for, or fixes the end)."""
        ranks = self._exchange([certain, int(ended)])
        self.exchanges += 1
        done = [count for count, ended in ranks if ended]
        going = [count for count, ended in ranks if not ended]
        if self.even_ranks is EvenRanks.DROP:
            # A rank still reading keeps at least its certain count: the smallest ended one
            # below every such count is the smallest kept count.
            if done and (not going or min(done) <= min(going)):
                self.final = min(done)
            self.horizon = min(count for count, _ in ranks)
        else:
            if not going:
                self.final = max(done)
            self.horizon = max(count for count, _ in ranks)


def look_ahead(emitted: int, buffer: SlotBuffer, merge: LaneMerge, count: int) -> tuple[int, bool]:
    """``(certain, ended)``: the samples this rank surely yields, having read on for
    ``count`` more, and whether its lanes ended (``certain`` is then its kept count)."""
    ready = merge.lookahead(buffer.pushes_for(count))
    return emitted + len(buffer) + ready, merge.exhausted


def undelivered(buffer: SlotBuffer, merge: LaneMerge, store: RowStore) -> int:
    """The samples this rank read but does not yield past the ranks' end: those in the
    buffer, and the rest of its lanes (read now, so that every record is counted)."""
    left = len(buffer)
    while True:
        ids, _ = merge.peek(1 << 16)
        if not len(ids):
            merge.consume(0)  # the tombstones after the last sample
            return left
        merge.consume(len(ids))
        store.release(ids)
        left += len(ids)


def refuse_simulated_filter(
    epoch: int, rank: int, world_size: int, where: str, transform_id: str | None = None
) -> ConfigError:
    """The error for a filter under ranks simulated in one process: at its first drop, or
    at ``iter()`` for a ``transform_id`` whose kept counts are not all learned."""
    if transform_id is not None:
        return ConfigError(
            f"epoch {epoch}: rank {rank} of world_size {world_size}, ranks given to "
            "MixingLoader(rank=, world_size=) with no torch.distributed process group, reads "
            f"a transform (transform_id={transform_id!r}) whose kept counts are not learned "
            "for every shard, so the ranks cannot know where the epoch ends; read one epoch "
            "of the dataset on one rank first (it learns them: shardmix.plan.kept), or run the "
            "ranks under torch.distributed (torchrun)"
        )
    return ConfigError(
        f"epoch {epoch}: the transform dropped {where} on rank {rank} of world_size "
        f"{world_size}, ranks given to MixingLoader(rank=, world_size=) with no "
        "torch.distributed process group, so the ranks cannot agree where the epoch ends and "
        "some would repeat or lose samples; give the transform a transform_id= and read one "
        "epoch on one rank first (the ranks then use the kept counts it learned), run the "
        "ranks under torch.distributed (torchrun), where they agree over gloo, or filter the "
        "shards beforehand (shardmix convert) so that their record counts are the kept ones"
    )


def refuse_phase_drop(epoch: int, rank: int, kind: str, phase: Mapping[str, Any]) -> ConfigError:
    """The error for a sample dropped (``kind``: filtered or skipped) in a resized phase."""
    what = "the transform dropped" if kind == FILTERED else 'on_error="skip" skipped'
    return ConfigError(
        f"epoch {epoch}: {what} a sample on rank {rank} in the rest of the epoch resumed on "
        f"another world size or batch size (from batch {phase.get('batches')}), whose equal "
        "shares were dealt ahead from the record counts, so the ranks would end it at "
        "different steps; resume with the saved world_size and batch_size, or from a state "
        "saved at an epoch's start"
    )
