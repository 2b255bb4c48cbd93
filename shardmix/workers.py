"""Workers: what runs in each DataLoader worker, and the trip of its chunks to the main process.

Each worker reads the lanes it hosts in turn and sends them as columnar
:class:`~shardmix.chunks.Chunk` objects, each with what the worker skipped since its last
chunk (``on_error="skip"``). Starting and stopping the workers is here too, so the rest of the
loader never touches torch's DataLoader.
"""

from __future__ import annotations

import gc
import math
import os
import resource
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from torch.utils.data import DataLoader, IterableDataset

from shardmix.chunks import Chunk, ChunkBuilder, LaneClocks
from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.lifeline import WorkerInit
from shardmix.policy import SkipLedger
from shardmix.progress import Heartbeat, watch_progress
from shardmix.reader import BlockTurns, LanePosition, round_robin_chunks
from shardmix.sharding import Piece, worker_lanes
from shardmix.sources import is_local
from shardmix.sources.bounded import plan_reads
from shardmix.sources.identity import ShardIdentity
from shardmix.sources.owners import this_owner
from shardmix.sources.traffic import take_traffic
from shardmix.world import detect_world

T = TypeVar("T")

if TYPE_CHECKING:
    from shardmix.pool import WorkerPool

# Remote shards open at once per process, at most: one connection each.
MAX_CONNECTIONS = 512
# Descriptors kept free beside the shards (pipes, sockets, imports).
_SPARE_DESCRIPTORS = 8
# How long to wait for a worker killed (SIGKILL) after its grace period to be reaped.
KILL_WAIT_SECONDS = 5.0
# Samples in a worker's chunk once its turns have grown: enough to amortise one pickle and one
# queue trip...
CHUNK_SAMPLES = 2048
# ... and per lane, at least this many in one stretch once a worker's turns have grown to it (as
# CHUNK_BYTES allows): a shard read in long stretches keeps its reader's buffer and state in the
# CPU's caches, where hundreds of open shards taken a few samples at a time cost a worker a
# third more CPU per small record. The main process holds about one turn of every lane
# (CHUNK_BYTES bounds it).
MIN_TURN = 64
# Samples in a worker's first chunk: the first batch waits for every worker's first chunk (the
# merge needs every lane's first samples), and for the shuffle buffer's warm-up (four batches),
# not for 2,048 samples a worker. The turns start at the lanes' share of this and double from
# chunk to chunk up to their steady size, so that only the first few chunks are small.
FIRST_CHUNK_SAMPLES = 256
# ... and at most about this many bytes of samples, so that the chunks in flight (two per
# worker, prefetch_factor) stay small whatever the record size.
CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class EpochPlan:
    """What a worker needs to read one epoch, beside the dataset it already holds.

    ``generation`` tells the chunks of one ``iter()`` from those of the one before it (a pool's
    workers serve many).
    """

    epoch: int
    rank: int
    world_size: int
    lane_pieces: list[list[Piece]] | None
    clocks: LaneClocks | None  # the lanes' sizes, when known: chunks are keyed by clock
    per_lane: int  # each lane's turn in a worker's first chunk
    starts: list[LanePosition] | None
    epoch_pass: int = 0  # the pass over the dataset within the epoch (mixtures)
    generation: int = 0
    steady: int = 0  # the turn the turns double up to (0: per_lane, as they start)
    # By shard index, the identity each shard must have (a restored checkpoint's).
    identities: Mapping[int, ShardIdentity] = field(default_factory=dict)


def lane_turn(num_lanes: int, num_workers: int, samples: int | None = None) -> int:
    """How many samples each of ``num_lanes`` lanes gives per turn in a worker's chunk of
    ``samples`` (:data:`CHUNK_SAMPLES` if None; CHUNK_BYTES may cut it): of
    :data:`FIRST_CHUNK_SAMPLES` for the first, whose turns then double up to
    :func:`steady_turn`."""
    chunk = CHUNK_SAMPLES if samples is None else samples
    return max(1, math.ceil(chunk * max(1, num_workers) / num_lanes))


def steady_turn(per_lane: int) -> int:
    """A lane's turn once a worker's turns have grown, ``per_lane`` being its share of
    :data:`CHUNK_SAMPLES` (:func:`lane_turn`)."""
    return max(MIN_TURN, per_lane)


def start_workers(
    dataset: IterableDataset[Any],
    *,
    epoch: int,
    rank: int,
    world_size: int,
    starts: list[LanePosition] | None,
    lane_pieces: list[list[Piece]] | None,
    clocks: LaneClocks | None,
    num_workers: int,
    epoch_pass: int = 0,
    timeout: float,
    prefetch_factor: int,
    multiprocessing_context: Any,
    worker_init_fn: Callable[[int], None] | None = None,
    pool: WorkerPool | None = None,
    identities: Mapping[int, ShardIdentity] | None = None,
) -> tuple[Iterator[Chunk], int, Any]:
    """Start reading ``epoch``: ``(what the workers send, number of lanes, the workers)``.

    ``lane_pieces`` is each lane's pieces (a ShardDataset's plan), ``clocks`` their sizes, when
    the mixer takes lanes in proportion to them. The workers are torch's
    DataLoader iterator (``None`` when ``num_workers`` is 0 and the lanes are read in this
    process, or when ``pool``'s persistent workers read them); stop them with
    :func:`stop_workers`. ``identities``: what each shard must be, by shard index (a
    checkpoint's); each chunk says the identities of the shards read for it.
    """
    if isinstance(dataset, ShardDataset) and lane_pieces is not None:
        lane_urls = [[dataset.urls[piece.shard] for piece in lane] for lane in lane_pieces]
        check_open_limits(lane_urls, num_workers)
        num_lanes = len(lane_pieces)
        steady = steady_turn(lane_turn(num_lanes, num_workers))
        per_lane = min(steady, lane_turn(num_lanes, num_workers, FIRST_CHUNK_SAMPLES))
    else:
        num_lanes = max(1, num_workers)
        steady, per_lane = CHUNK_SAMPLES, FIRST_CHUNK_SAMPLES
    plan = EpochPlan(
        epoch,
        rank,
        world_size,
        lane_pieces,
        clocks,
        per_lane,
        starts,
        epoch_pass,
        identities=identities if identities is not None else {},
        steady=steady,
    )
    if isinstance(dataset, ShardDataset):
        _tell_cache(dataset, plan)
    if pool is not None and num_workers > 0:
        return pool.start_epoch(plan), num_lanes, None
    heartbeat = Heartbeat(num_workers) if num_workers > 0 and timeout > 0 else None
    source = _LaneChunks(dataset, plan, heartbeat)
    if num_workers == 0:
        return iter(source), num_lanes, None
    loader = DataLoader(
        source,
        batch_size=None,
        collate_fn=as_sent,
        num_workers=num_workers,
        timeout=timeout,
        prefetch_factor=prefetch_factor,
        multiprocessing_context=multiprocessing_context,
        worker_init_fn=WorkerInit(worker_init_fn),
    )
    workers = iter(loader)
    if heartbeat is not None:
        watch_progress(workers, heartbeat, timeout)
    return workers, num_lanes, workers


def check_open_limits(lane_urls: list[list[str]], num_workers: int) -> None:
    """Refuse, naming the settings to change, a plan whose open shards per process would pass
    the open-file limit (RLIMIT_NOFILE) or, for remote shards, :data:`MAX_CONNECTIONS`.

    Each lane keeps one shard open; lane ``l`` lives in worker ``l % num_workers``.
    """
    num_lanes = len(lane_urls)
    per_process = math.ceil(num_lanes / max(1, num_workers))
    where = "per worker" if num_workers else "in this process (num_workers=0)"
    remote = any(not is_local(url) for urls in lane_urls for url in urls)
    if remote and per_process > MAX_CONNECTIONS:
        raise ConfigError(
            f"{num_lanes} lanes over {max(1, num_workers)} processes would hold {per_process} "
            f"connections to remote shards open {where}, more than shardmix's cap of "
            f"{MAX_CONNECTIONS}; raise num_workers or pass ShardDataset(num_lanes=...) lower"
        )
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = _open_descriptors()
    if soft != resource.RLIM_INFINITY and in_use + per_process + _SPARE_DESCRIPTORS > soft:
        raise ConfigError(
            f"{num_lanes} lanes over {max(1, num_workers)} processes would open {per_process} "
            f"shards at once {where}, with {in_use} files already open, past the open-file "
            f"limit of {soft} (RLIMIT_NOFILE); raise it (ulimit -n), raise num_workers, or "
            "pass ShardDataset(num_lanes=...) lower"
        )


def _tell_cache(dataset: ShardDataset, plan: EpochPlan) -> None:
    """Tell a bounded cache the shards the lanes read this epoch, in order (the workers, this
    process's children, mark them read as they open them)."""
    options = dataset.source_options
    if options.cache_limit is None or options.cache_dir is None or plan.lane_pieces is None:
        return
    starts = plan.starts or [LanePosition()] * len(plan.lane_pieces)
    urls = [
        [dataset.urls[piece.shard] for piece in plan.lane_pieces[lane][starts[lane].slot :]]
        for lane in range(len(plan.lane_pieces))
    ]
    plan_reads(options.cache_dir, f"{this_owner()}/{id(dataset)}", urls)


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: assume a small process
        return 32


def stop_workers(workers: Any) -> None:
    """Stop the DataLoader workers that :func:`start_workers` started (``None``: nothing)."""
    processes = worker_processes(workers)
    shutdown = getattr(workers, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()  # asks each worker to end, waits a grace period, then sends SIGTERM
    for process in processes:
        # A stopped worker (SIGSTOP) holds SIGTERM pending forever, and Python's exit would
        # join it forever: what outlived the grace period is killed, which a stop cannot hold.
        if process.is_alive():
            process.kill()
            process.join(KILL_WAIT_SECONDS)


def is_worker_failure(error: RuntimeError) -> bool:
    """Whether torch's DataLoader raised ``error`` for a worker that died or stalled."""
    message = str(error)
    return "DataLoader worker" in message or "DataLoader timed out" in message


def worker_processes(workers: Any) -> list[Any]:
    """The processes of a DataLoader iterator (``None``: none), in worker order."""
    return list(getattr(workers, "_workers", None) or [])


def failure_message(
    epoch: int, error: RuntimeError, processes: list[Any], plan: list[list[Piece]] | None, urls: Any
) -> str:
    """What a :class:`~shardmix.errors.WorkerError` says: which worker ended, how, and the
    lanes and shards it hosted, whose samples the epoch will never have."""
    dead = []
    for worker, process in enumerate(processes):
        code = process.exitcode if not process.is_alive() else None
        if code is None:
            continue
        how = f"exited with status {code}"
        if code < 0:
            how = f"was killed by signal {-code} ({_signal_name(-code)})"
        what = ""
        if plan is not None:
            lanes = worker_lanes(num_lanes=len(plan), worker=worker, num_workers=len(processes))
            shards = sorted({str(urls[piece.shard]) for lane in lanes for piece in plan[lane]})
            shown = ", ".join(shards[:4]) + (
                f" and {len(shards) - 4} more" if len(shards) > 4 else ""
            )
            what = f", hosting lanes {lanes} (shards {shown or 'none'})"
        dead.append(f"worker {worker} (pid {process.pid}) {how}{what}")
    if not dead:
        return f"epoch {epoch}: {error}"
    return (
        f"epoch {epoch}: {'; '.join(dead)}; the epoch cannot complete without its samples ({error})"
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"


def as_sent(chunk: Any) -> Any:
    """Pass chunks through untouched (the DataLoader would turn arrays into tensors)."""
    return chunk


class _LaneChunks(IterableDataset[Chunk]):
    """Runs in each worker: reads the worker's lanes of one epoch and yields them in chunks."""

    def __init__(
        self, dataset: IterableDataset[Any], plan: EpochPlan, heartbeat: Heartbeat | None
    ) -> None:
        self.dataset = dataset
        self.plan = plan
        self.heartbeat = heartbeat

    def __iter__(self) -> Iterator[Chunk]:
        return lane_chunks(self.dataset, self.plan, self.heartbeat)


def lane_chunks(
    dataset: IterableDataset[Any], plan: EpochPlan, heartbeat: Heartbeat | None = None
) -> Iterator[Chunk]:
    """This process's lanes of ``plan``, in chunks, with what was skipped since the last;
    each sample read (each record block) counted into ``heartbeat``, if given."""
    world = detect_world(plan.rank, plan.world_size)
    beat = _counter(heartbeat, world.worker)
    ledger = SkipLedger(max_skips=None, warn=False)  # the main process holds the budget
    shares = None
    shard_index = None
    if isinstance(dataset, ShardDataset) and plan.lane_pieces is not None:
        shard_index = dataset.shard_index
        dataset.ledger = ledger  # this process's copy of the dataset
        dataset.expected = plan.identities
        num_lanes = len(plan.lane_pieces)
        worker, num_workers = world.worker, world.num_workers
        lanes = worker_lanes(num_lanes=num_lanes, worker=worker, num_workers=num_workers)
        starts = plan.starts or [LanePosition()] * num_lanes
        iterators: dict[int, Iterator[Any] | BlockTurns]
        if dataset.reads_blocks:  # no transform: records go to the chunks' columns in blocks
            iterators = {
                lane: BlockTurns(
                    beat(dataset.read_lane_blocks(plan.lane_pieces[lane], starts[lane]))
                )
                for lane in lanes
            }
        else:
            iterators = {
                lane: beat(
                    dataset.read_lane_pieces(
                        plan.lane_pieces[lane], plan.epoch, starts[lane], plan.epoch_pass
                    )
                )
                for lane in lanes
            }
        if plan.clocks is not None:
            every = plan.clocks.shares()
            shares = {lane: every[lane] for lane in lanes}
    else:
        set_epoch = getattr(dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(plan.epoch)
        iterators = {world.worker: beat(iter(dataset))}
    builder = ChunkBuilder(shard_index, plan.clocks if shard_index is not None else None)
    groups = round_robin_chunks(
        iterators,
        plan.per_lane,
        CHUNK_BYTES,
        shares,
        lambda: builder.mean_size,
        steady=plan.steady or plan.per_lane,
    )
    chunks: Iterator[Chunk] = (builder.build(group, ledger.take()) for group in groups)
    if shard_index is not None:
        assert isinstance(dataset, ShardDataset)
        chunks = _with_identities(chunks, dataset)
    return collected_between(_with_traffic(chunks))


def _with_identities(chunks: Iterator[Chunk], dataset: ShardDataset) -> Iterator[Chunk]:
    """``chunks``, each with the identities of the shards opened until it was made."""
    for chunk in chunks:
        chunk.identities = dataset.take_opened()
        yield chunk


def _with_traffic(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """``chunks``, each with what this process's sources fetched since the one before."""
    for chunk in chunks:
        chunk.traffic = take_traffic() or None
        yield chunk


def _counter(heartbeat: Heartbeat | None, worker: int) -> Callable[[Iterator[T]], Iterator[T]]:
    """Wrap a lane's iterator so that what it reads is counted into ``heartbeat`` (if any)."""
    if heartbeat is None:
        return lambda items: items
    return lambda items: heartbeat.counted(items, worker)


def collected_between(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """``chunks``, with Python's cycle collector paused while each is made.

    A chunk's samples are thousands of dicts alive at once: left running, the collector would
    scan them over and over while they pile up (about a quarter of a worker's CPU time on
    small records). Paused, it runs once the chunk is made and its dicts are freed, so cyclic
    garbage waits at most one chunk. Where the collector was off already, it stays off.
    """
    while True:
        enabled = gc.isenabled()
        gc.disable()
        try:
            chunk = next(chunks, None)
        finally:
            if enabled:
                gc.enable()
        if chunk is None:
            return
        yield chunk
