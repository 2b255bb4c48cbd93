"""Token streams: tokens/s, main-process CPU per token, padding and cut documents.

:class:`~shardmix.tokens.TokenLoader` (best fit and concat) beside a plain concat-and-chunk
``IterableDataset`` in a DataLoader, over the same tar shards of ``uint16`` tokens.

The shards: ``--shards`` of ``--documents`` documents each, log-normal lengths (mean of the log
5, sigma 1: a mean of about 250 tokens, 2.6% longer than ``seq_len`` 1,024). Each round reads
one epoch with each loader (2 workers, batch 8, ``seq_len`` 1,024), the loaders interleaved;
the figures are medians of ``--rounds`` rounds. A document is *cut* when its tokens are in more
than one row (unavoidable for one longer than ``seq_len``: counted apart). Padding excludes the
epoch's last batch. LitData's ``TokensLoader`` is not measured: its wheel would replace this
environment's torch.

Run from the repository root::

    python tools/bench_tokens.py [--rounds 5] [--shards 16] [--documents 1500]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "tokens"))
from token_shards import write_token_shards  # noqa: E402

from shardmix import ShardDataset  # noqa: E402
from shardmix.tokens import TokenLoader  # noqa: E402
from shardmix.tokens.packing import concat  # noqa: E402

SEQ_LEN, BATCH, WORKERS = 1024, 8, 2


class ConcatChunk(IterableDataset[Any]):
    """Each worker reads its shards in order, concatenates their documents, cuts rows."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        paths = self.paths[info.id :: info.num_workers] if info else self.paths
        pending = np.zeros(0, np.int64)
        for tokens in documents(paths):
            pending = np.concatenate([pending, tokens])
            while len(pending) >= SEQ_LEN:
                yield torch.from_numpy(pending[:SEQ_LEN].copy())
                pending = pending[SEQ_LEN:]
        if len(pending):
            yield torch.from_numpy(np.pad(pending, (0, SEQ_LEN - len(pending)), constant_values=-1))


def documents(paths: list[str]) -> Iterator[np.ndarray]:
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                data = tar.extractfile(member)
                if data is not None:
                    yield np.load(io.BytesIO(data.read())).astype(np.int64)


def run_tokenloader(pattern: str, packing: str) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        loader = TokenLoader(
            ShardDataset(pattern, seed=0),
            seq_len=SEQ_LEN,
            batch_size=BATCH,
            num_workers=WORKERS,
            packing=packing,
        )
        pieces: Counter[tuple[str, Any]] = Counter()
        padding = last = 0
        start, cpu = time.perf_counter(), time.process_time()
        for batch in loader:
            last = int((batch["segment_ids"] == 0).sum())
            padding += last
            for spans in batch["__segments__"]:
                pieces.update((source, key) for source, key, _, _ in spans)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        loader.close()
        return {"seconds": seconds, "cpu": cpu, "padding": padding - last, "cut": cut(pieces)}

    return run


def cut(pieces: Counter[Any]) -> int:
    return sum(count > 1 for count in pieces.values())


def run_concat(paths: list[str]) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        loader = DataLoader(ConcatChunk(paths), batch_size=BATCH, num_workers=WORKERS)
        padding = last = 0
        start, cpu = time.perf_counter(), time.process_time()
        for batch in loader:
            last = int((batch == -1).sum())
            padding += last
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        # The cut documents, from the same concatenation of each worker's shards.
        lengths = [[len(t) for t in documents(paths[w::WORKERS])] for w in range(WORKERS)]
        pieces = Counter(
            (worker, document)
            for worker, own in enumerate(lengths)
            for row in concat(own, SEQ_LEN)
            for document, _, _ in row
        )
        return {"seconds": seconds, "cpu": cpu, "padding": padding - last, "cut": cut(pieces)}

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--documents", type=int, default=1500)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-tokens-"))
    pattern, written = write_token_shards(folder, args.shards, args.documents, mean_log=5.0)
    paths = sorted({path for path, _ in written})
    tokens = sum(len(t) for t in written.values())
    longer = sum(len(t) > SEQ_LEN for t in written.values())
    runs = {
        "TokenLoader best_fit": run_tokenloader(pattern, "best_fit"),
        "TokenLoader concat": run_tokenloader(pattern, "concat"),
        "concat-and-chunk DataLoader": run_concat(paths),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            results[name].append(run())
    print(f"{len(written)} documents, {tokens} tokens, {longer} longer than {SEQ_LEN}")
    print(f"{'loader':30} {'Mtok/s':>7} {'main CPU ns/tok':>15} {'padding %':>9} {'cut docs':>9}")
    for name, rounds in results.items():
        seconds = statistics.median(r["seconds"] for r in rounds)
        cpu = statistics.median(r["cpu"] for r in rounds)
        padding, cuts = rounds[0]["padding"], rounds[0]["cut"]
        print(
            f"{name:30} {tokens / seconds / 1e6:7.2f} {cpu / tokens * 1e9:15.1f} "
            f"{100 * padding / tokens:9.4f} {cuts:9d}"
        )


if __name__ == "__main__":
    main()
