"""One epoch's workers as the trainer process sees them: started, watched, named, stopped.

Each chunk is checked against the shard identities seen before (a shard rewritten while the
epoch reads it is refused); those identities are the epoch state's ``"shards"`` entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, NoReturn, TypeGuard, TypeVar

from torch.utils.data import IterableDataset

from shardmix.errors import ShardmixError, WorkerError
from shardmix.plan.sharding import Piece
from shardmix.reading.chunks import Chunk
from shardmix.reading.lanes import LanePosition
from shardmix.reading.mergekeys import LaneClocks
from shardmix.reading.shardreads import shard_reads
from shardmix.sources.identity import ShardIdentity, check_identity
from shardmix.state.codec import pack_identities, unpack_identities
from shardmix.workers.dataloader import (
    WorkerOptions,
    failure_message,
    is_worker_failure,
    start_workers,
    stop_workers,
    worker_processes,
)
from shardmix.workers.pool import WorkerPool

__all__ = ["EpochWorkers"]

T = TypeVar("T")


@dataclass(eq=False)
class EpochWorkers:
    """The workers of ``epoch`` of ``dataset`` on ``rank``, reading the lanes of ``plan`` (None:
    not a ShardDataset); ``timed`` wraps what they send; ``pool``'s stop only at :meth:`fail`."""

    dataset: IterableDataset[Any]
    options: WorkerOptions
    pool: WorkerPool | None
    plan: list[list[Piece]] | None
    timed: Callable[[Iterator[Chunk]], Iterator[Chunk]]
    _: KW_ONLY
    epoch: int
    epoch_pass: int
    rank: int
    world_size: int
    seed: int  # the loader's: its workers' base seed comes from it, never torch's
    _workers: Any = field(default=None, init=False)
    _sent: Generator[Chunk, None, None] | None = field(default=None, init=False)  # start()'s
    # By shard index, the identity each shard read had: a shard found otherwise is refused.
    identities: dict[int, ShardIdentity] = field(default_factory=dict, init=False)
    _urls: Sequence[str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        reads = shard_reads(self.dataset)
        self._urls = reads.plan.urls if reads is not None else None

    def identities_state(self, shards: Iterable[int]) -> list[list[Any]]:
        """The state's ``"shards"`` entry: the identities seen of ``shards``, in shard order."""
        seen = {shard: identity.to_json() for shard, identity in self.identities.items()}
        return pack_identities(seen, shards)

    def load_identities(self, saved: Sequence[Any]) -> None:
        """Hold the shards to the identities a state's ``"shards"`` entry says they had."""
        urls = self._urls or ()  # a ShardDataset's: the loader restores no other
        found = unpack_identities(saved, len(urls), "shards")
        self.identities = {shard: ShardIdentity.from_json(v) for shard, v in found.items()}

    def start(
        self, starts: list[LanePosition] | None, clocks: LaneClocks | None
    ) -> tuple[Iterator[Chunk], int]:
        """Start each lane at its ``starts`` (None: its beginning): ``(checked chunks, lanes)``."""
        with self._start_named():
            sent, num_lanes, self._workers = start_workers(
                self.dataset,
                epoch=self.epoch,
                rank=self.rank,
                world_size=self.world_size,
                starts=starts,
                epoch_pass=self.epoch_pass,
                seed=self.seed,
                lane_pieces=self.plan,
                clocks=clocks,
                options=self.options,
                pool=self.pool,
                identities=dict(self.identities),
                on_start=self._started,
            )
        self._sent = self._checked(self.timed(sent))
        return self._sent, num_lanes

    def _started(self, workers: Any) -> None:
        self._workers = workers  # named and stopped by a failure before start() returns

    @contextlib.contextmanager
    def _start_named(self) -> Iterator[None]:
        """A worker that dies while the workers start is a named WorkerError there too."""
        try:
            yield
        except RuntimeError as error:
            if _is_death(error):
                self._fail_named(error, self.fail)
            raise

    def _checked(self, sent: Iterator[Chunk]) -> Generator[Chunk, None, None]:
        """``sent``, each chunk's shard identities checked against those seen before."""
        identities = self.identities
        urls = self._urls or ()  # only a ShardDataset's chunks say identities
        for chunk in sent:
            for shard, identity in chunk.identities.items():
                known = identities.get(shard)
                if known is None:
                    identities[shard] = identity
                elif known != identity:
                    check_identity(urls[shard], known, identity)
            yield chunk

    def guarded(self, step: Callable[[], T], fail: Callable[[], None]) -> T:
        """``step()``; on an error, ``fail()`` stops the workers at once, a dead worker named."""
        try:
            return step()
        except StopIteration:
            raise
        except BaseException as error:
            if _is_death(error):
                self._fail_named(error, fail)
            fail()
            raise

    def _fail_named(self, error: RuntimeError, fail: Callable[[], None]) -> NoReturn:
        """Raise the named failure of ``error``, asked before ``fail()`` stops the workers."""
        failure = self.named_failure(error)
        fail()
        raise failure from error

    def named_failure(self, error: RuntimeError) -> WorkerError:
        """The WorkerError naming the dead worker, its lanes and shards (ask before stopping)."""
        pool = self.pool
        processes = pool.processes() if pool is not None else worker_processes(self._workers)
        return WorkerError(failure_message(self.epoch, error, processes, self.plan, self._urls))

    def close(self) -> None:
        """Stop this epoch's workers now (a pool's persistent workers stay)."""
        workers, self._workers = self._workers, None
        stop_workers(workers)
        # With no worker processes, this one's lanes hold their shards open until closed.
        sent, self._sent = self._sent, None
        if sent is not None:
            sent.close()

    def fail(self) -> None:
        """Stop the workers this epoch ran on, persistent or not."""
        self.close()
        if self.pool is not None:
            self.pool.close()


def _is_death(error: BaseException) -> TypeGuard[RuntimeError]:
    """Whether ``error`` is torch's report of a dead or stalled worker (not one of ours)."""
    return (
        isinstance(error, RuntimeError)
        and not isinstance(error, ShardmixError)
        and is_worker_failure(error)
    )
