"""Workers: an epoch's reading planned, started, stopped, and named when a worker dies.

:func:`start_workers` checks a plan against the process's limits, tells a bounded cache what
the epoch reads, and starts the reading: in this process, in torch's DataLoader workers or in a
:class:`~shardmix.workers.pool.WorkerPool`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import resource
import signal
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from shardmix.errors import ConfigError
from shardmix.plan.sharding import Piece, worker_lanes
from shardmix.reading.chunks import Chunk
from shardmix.reading.lanechunks import EpochPlan, LaneChunks, as_sent, sent_plan, steady_turn
from shardmix.reading.lanes import LanePosition
from shardmix.reading.mergekeys import LaneClocks
from shardmix.reading.progress import Heartbeat, watch_progress
from shardmix.reading.shardreads import ShardReads, shard_reads
from shardmix.sources import is_local
from shardmix.sources.cache.bounded import plan_reads
from shardmix.sources.cache.ledger import this_owner
from shardmix.sources.identity import ShardIdentity
from shardmix.workers.arena import Arena, InRings
from shardmix.workers.forkstart import StartFlags, forks, start_forked
from shardmix.workers.lifeline import WorkerInit, proc_stat

MAX_CONNECTIONS = 512  # remote shards open at once per process, at most: a connection each
_SPARE_DESCRIPTORS = 8  # descriptors kept free beside the shards (pipes, sockets, imports)
KILL_WAIT_SECONDS = 5.0  # for a worker killed (SIGKILL) after its grace period to be reaped
# Samples in a worker's chunk once its turns have grown: one pickle and queue trip amortised.
CHUNK_SAMPLES = 2048
# Samples in a worker's first chunk, which the first batch waits for (the merge needs every
# lane's first samples); the turns then double up to their steady size.
FIRST_CHUNK_SAMPLES = 256
_SEED_STREAM = 0x5EED  # keeps the workers' seeds apart from other streams of the same seed


@dataclass(frozen=True)
class WorkerOptions:
    """How an epoch's lanes are read: in this process (``num_workers`` 0) or in DataLoader
    workers, with these settings of torch's."""

    num_workers: int = 0
    timeout: float = 0.0
    prefetch_factor: int = 2
    multiprocessing_context: Any = None
    worker_init_fn: Callable[[int], None] | None = None


class PersistentWorkers(Protocol):
    """Workers that outlive an epoch (a :class:`~shardmix.workers.pool.WorkerPool`)."""

    def start_epoch(self, plan: EpochPlan) -> Iterator[Chunk]: ...


def lane_turn(num_lanes: int, num_workers: int, samples: int = CHUNK_SAMPLES) -> int:
    """How many samples each of ``num_lanes`` lanes gives per turn in a chunk of ``samples``."""
    return max(1, math.ceil(samples * max(1, num_workers) / num_lanes))


def start_workers(
    dataset: IterableDataset[Any],
    *,
    epoch: int,
    rank: int,
    world_size: int,
    starts: list[LanePosition] | None,
    lane_pieces: list[list[Piece]] | None,
    clocks: LaneClocks | None,
    options: WorkerOptions,
    epoch_pass: int = 0,
    seed: int = 0,
    pool: PersistentWorkers | None = None,
    identities: Mapping[int, ShardIdentity] | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> tuple[Iterator[Chunk], int, Any]:
    """Start reading ``epoch``: ``(what the workers send, number of lanes, the workers)``, the
    workers being torch's DataLoader iterator to :func:`stop_workers` (None: none to stop).
    ``on_start`` is given each start's workers as their processes start, before they are
    checked: a worker that dies while they start can be named and the others stopped."""
    num_workers, timeout = options.num_workers, options.timeout
    reads = shard_reads(dataset)
    num_lanes, per_lane, steady = _checked_lanes(reads, lane_pieces, num_workers)
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
        seed=seed,
        recounts=reads.plan.record_counts.recounts() if reads is not None else {},
    )
    if reads is not None:
        _tell_cache(reads, plan)
    if num_workers == 0:
        return iter(LaneChunks(dataset, plan, None)), num_lanes, None
    if pool is not None:  # its queues pickle the plan for every worker
        return pool.start_epoch(sent_plan(plan)), num_lanes, None
    if not forks(options.multiprocessing_context):  # else the workers inherit it unpickled
        plan = sent_plan(plan)
    heartbeat = Heartbeat(num_workers) if timeout > 0 else None
    source = LaneChunks(dataset, plan, heartbeat)

    arena = Arena.create(num_workers)  # the chunks' arrays through shared memory

    def start(flags: StartFlags | None) -> Any:
        started = None if flags is None else flags.mark
        loader = DataLoader(
            source if arena is None else InRings(source, arena),
            batch_size=None,
            collate_fn=as_sent,
            num_workers=num_workers,
            timeout=timeout,
            prefetch_factor=options.prefetch_factor,
            multiprocessing_context=options.multiprocessing_context,
            worker_init_fn=WorkerInit(options.worker_init_fn, started),
            generator=seed_generator(plan),
        )
        workers = iter(loader)
        if on_start is not None:
            on_start(workers)
        return workers

    try:
        if forks(options.multiprocessing_context):  # a forked worker may hang at its start
            workers = start_forked(start, stop_workers, num_workers, worker_processes)
        else:
            workers = start(None)
    except BaseException:
        if arena is not None:
            arena.close()
        raise
    chunks: Iterator[Chunk] = workers
    if arena is not None:  # closed at the epoch's end, with the workers, or once collected
        _RINGS[workers] = rings = weakref.finalize(workers, arena.close)
        chunks = _closing_at_end(workers, rings)
    if heartbeat is not None:
        watch_progress(workers, heartbeat, timeout)
    DEATHS.wrap_handler()
    _STARTED.add(workers)
    return chunks, num_lanes, workers


def _closing_at_end(chunks: Iterator[Chunk], close: Callable[[], Any]) -> Iterator[Chunk]:
    yield from chunks
    close()  # the workers have sent their last chunk, and it has been unpickled


def seed_generator(plan: EpochPlan) -> torch.Generator:
    """The generator of the workers' base seed, from ``plan``'s ``(seed, epoch, pass, rank)``:
    torch's global one would make the trainer's stream (dropout's) differ after a resume."""
    key = [_SEED_STREAM, plan.seed, plan.epoch, plan.epoch_pass, plan.rank]
    state = np.random.SeedSequence(key).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state >> 1))


def _checked_lanes(
    reads: ShardReads | None, lane_pieces: list[list[Piece]] | None, num_workers: int
) -> tuple[int, int, int]:
    """``(lanes, samples per lane in a worker's first chunk, in its steady chunks)`` of a
    plan checked against the process's limits (any other dataset: one lane per worker)."""
    if reads is None or lane_pieces is None:
        return max(1, num_workers), FIRST_CHUNK_SAMPLES, CHUNK_SAMPLES
    num_lanes = len(lane_pieces)
    shards = {piece.shard for lane in lane_pieces for piece in lane}
    check_open_limits(num_lanes, [reads.plan.urls[shard] for shard in shards], num_workers)
    steady = steady_turn(lane_turn(num_lanes, num_workers))
    return num_lanes, min(steady, lane_turn(num_lanes, num_workers, FIRST_CHUNK_SAMPLES)), steady


def check_open_limits(num_lanes: int, urls: list[str], num_workers: int) -> None:
    """Refuse a plan whose open shards per process (one per lane, of ``urls``) would pass the
    open-file limit or, for remote shards, :data:`MAX_CONNECTIONS`."""
    per_process = math.ceil(num_lanes / max(1, num_workers))
    where = "per worker" if num_workers else "in this process (num_workers=0)"
    remote = any(not is_local(url) for url in urls)
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


def _tell_cache(reads: ShardReads, plan: EpochPlan) -> None:
    """Tell a bounded cache the shards the lanes read this epoch, in order."""
    options = reads.source_options
    if options.cache_limit is None or options.cache_dir is None or plan.lane_pieces is None:
        return
    starts = plan.starts or [LanePosition()] * len(plan.lane_pieces)
    urls = [
        [reads.plan.urls[piece.shard] for piece in plan.lane_pieces[lane][starts[lane].slot :]]
        for lane in range(len(plan.lane_pieces))
    ]
    plan_reads(options.cache_dir, f"{this_owner()}/{id(reads)}", urls)


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: assume a small process
        return 32


# Workers not stopped yet, stopped at exit before multiprocessing's own hook, which joins them
# without a limit (forever, for a stopped one).
_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()
# An epoch's workers' shared-memory rings, closed when they stop.
_RINGS: weakref.WeakKeyDictionary[Any, weakref.finalize] = weakref.WeakKeyDictionary()


@atexit.register
def _stop_started() -> None:
    for workers in list(_STARTED):
        stop_workers(workers)


def stop_workers(workers: Any) -> None:
    """Stop the DataLoader workers that :func:`start_workers` started (``None``: nothing)."""
    rings = None
    with contextlib.suppress(TypeError):  # None, or not weakly referenced: never added
        _STARTED.discard(workers)
        rings = _RINGS.pop(workers, None)
    processes = worker_processes(workers)
    for process in processes:
        if _is_stopped(process.pid):  # SIGSTOPped: torch would wait 10 s on it
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGCONT)
    shutdown = getattr(workers, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()  # asks each worker to end, waits a grace period, then sends SIGTERM
    for process in processes:
        # A stopped worker holds SIGTERM pending forever: kill what outlived the grace period.
        if process.is_alive():
            process.kill()
            process.join(KILL_WAIT_SECONDS)
    if rings is not None:
        rings()


def _is_stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, or traced), from /proc (False elsewhere)."""
    return proc_stat(pid)[:1] in (["T"], ["t"])


class WorkerDeaths:
    """Where torch's report of a dead worker is raised: inside a loader's step (``with
    deaths.here():``, which names the worker), never in the trainer's code between steps."""

    def __init__(self) -> None:
        self.depth = 0  # steps under way (a step may start another loader's)
        self.kept: list[RuntimeError] = []
        self.handler: Any = None  # the SIGCHLD handler this wrapped torch's in

    @contextlib.contextmanager
    def here(self) -> Iterator[None]:
        self.depth += 1
        try:
            if self.kept:
                kept, self.kept = self.kept[0], []
                raise kept
            yield
        finally:
            self.depth -= 1

    def wrap_handler(self) -> None:
        """Wrap the SIGCHLD handler torch installs as a process's first workers start."""
        handler = signal.getsignal(signal.SIGCHLD)
        if handler is self.handler or not callable(handler):
            return
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread sets signal handlers

        def deferred(signum: int, frame: Any) -> None:
            if self.depth:
                handler(signum, frame)
                return
            try:
                handler(signum, frame)
            except RuntimeError as error:
                if not is_worker_failure(error):
                    raise
                self.kept.append(error)

        signal.signal(signal.SIGCHLD, deferred)
        self.handler = deferred


DEATHS = WorkerDeaths()


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
    """What a WorkerError says: which worker ended, how, and the lanes and shards it hosted."""
    ended = [
        (worker, process, process.exitcode)
        for worker, process in enumerate(processes)
        if not process.is_alive() and process.exitcode is not None
    ]
    if any(code for _, _, code in ended):  # a worker that finished its lanes exits with 0
        ended = [(worker, process, code) for worker, process, code in ended if code]
    dead = []
    for worker, process, code in ended:
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
