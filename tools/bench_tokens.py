"""Token streams: tokens/s, CPU per token, padding and cut documents, beside LitData.

The same documents, read one epoch at a time by each side, 2 workers, batch 8, ``seq_len``
1,024:

- ``TokenLoader best_fit`` and ``TokenLoader concat``: :class:`~shardmix.tokens.TokenLoader`
  over ``--shards`` tar shards of ``--documents`` documents each (``tokens.npy``, ``uint16``,
  log-normal lengths: mean of the log 5, sigma 1, a mean of about 250 tokens, 2.6% longer than
  ``seq_len``), the shards' record counts and offset index in a counts cache written before the
  rounds (as a later job over the same shards finds it; LitData's ``optimize`` writes its own
  index);
- ``concat-and-chunk DataLoader``: a plain ``IterableDataset`` in a DataLoader, each worker
  concatenating its shards' documents and cutting rows;
- ``LitData TokensLoader``: the same documents written by ``litdata.optimize`` (one chunk file
  per shard's worth of tokens) and read by ``StreamingDataset(item_loader=TokensLoader(
  block_size=1024), shuffle=True)`` in a ``StreamingDataLoader``. ``block_size`` is ``seq_len``
  (not LitGPT's ``seq_len + 1``) so that both sides deliver rows of the same tokens; its
  chunks' memory maps stay open (LitData 0.2.60 crashes otherwise: :func:`run_litdata`).

Per side: tokens/s (the documents' tokens delivered over the wall time of the epoch, from
``iter()`` to the last batch), the seconds to the first batch and the tokens/s after it (best
fit packs a whole window, 16,384 documents, before its first row: a wait LitData's rows, cut
where they fall, do not have), main-process CPU µs per token, all processes' CPU µs per token
(the main process's and its DataLoader workers', ``getrusage``, :mod:`benchkit`), the padding
share (padding over the documents' tokens, the epoch's last batch aside), the documents cut
(in more than one row, or partly dropped; one longer than ``seq_len`` must be cut) and the
tokens dropped (LitData's ``TokensLoader`` drops each chunk's last ``dim % block_size`` tokens;
shardmix drops none). The sides take turns, ``--rounds`` rounds, the order rotated each round;
figures are medians with their range, ratios are taken within a round. CPU time per token holds
on a shared machine; tokens/s swings with the load.

LitData is not a shardmix dependency, nor in the ``[test]`` extra: its wheel requires
torchvision and would replace a pinned torch. Install it beside the torch you have with
``pip install --no-deps litdata tifffile`` (its other requirements it imports, numpy, filelock,
lightning-utilities, boto3 and requests, are usually there already); without it the bench runs
the other sides and says that LitData was skipped. Run from the repository root::

    python tools/bench_tokens.py [--rounds 5] [--shards 16] [--documents 10000] [--json]

``python tools/bench.py --only tokens --doc`` runs it as the ``tokens`` section.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import statistics
import subprocess
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "tokens"))
from benchkit import cpu_seconds  # noqa: E402
from token_shards import write_token_shards  # noqa: E402

from shardmix import MixingLoader, ShardDataset  # noqa: E402
from shardmix.tokens import TokenLoader  # noqa: E402
from shardmix.tokens.packing import concat  # noqa: E402

# LitData asks PyPI for a newer version of itself when a StreamingDataset is made: not here.
os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
TITLE = "token streams: TokenLoader beside LitData's TokensLoader, seq_len 1,024, batch 8"
SEQ_LEN, BATCH, WORKERS = 1024, 8, 2
LITDATA = "LitData TokensLoader"
OURS = "TokenLoader best_fit"
Run = Callable[[], dict[str, float]]


def tar_documents(path: str) -> Iterator[np.ndarray]:
    """The token arrays of one tar shard, in order (LitData's ``optimize`` calls it by name)."""
    with tarfile.open(path) as tar:
        for member in tar:
            data = tar.extractfile(member)
            if data is not None:
                yield np.load(io.BytesIO(data.read()))


class ConcatChunk(IterableDataset[Any]):
    """Each worker reads its shards in order, concatenates their documents, cuts rows."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        paths = self.paths[info.id :: info.num_workers] if info else self.paths
        pending = np.zeros(0, np.int64)
        for path in paths:
            for tokens in tar_documents(path):
                pending = np.concatenate([pending, tokens.astype(np.int64)])
                while len(pending) >= SEQ_LEN:
                    yield torch.from_numpy(pending[:SEQ_LEN].copy())
                    pending = pending[SEQ_LEN:]
        if len(pending):
            yield torch.from_numpy(np.pad(pending, (0, SEQ_LEN - len(pending)), constant_values=-1))


def timed(epoch: Iterator[tuple[int, int]], close: Callable[[], None]) -> dict[str, float]:
    """Wall and CPU time of one epoch, whose batches ``epoch`` yields as (tokens in their rows,
    padding among them); ``close`` joins the workers (their CPU counts once waited for)."""
    gc.collect()
    main, workers = cpu_seconds(), cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    tokens = padding = last = 0
    first: tuple[float, int] | None = None  # the first batch's time and tokens
    for size, last in epoch:
        tokens += size - last
        padding += last
        first = first or (time.perf_counter() - start, tokens)
    seconds = time.perf_counter() - start
    main = cpu_seconds() - main
    close()
    workers = cpu_seconds(resource.RUSAGE_CHILDREN) - workers
    assert first is not None
    return {
        "seconds": seconds,
        "first": first[0],
        "after_first": (tokens - first[1]) / max(seconds - first[0], 1e-9),
        "main": main,
        "workers": workers,
        "delivered": tokens,
        "padding": padding - last,
    }


def run_tokenloader(pattern: str, counts: Path, packing: str) -> Run:
    def run() -> dict[str, float]:
        loader = TokenLoader(
            ShardDataset(pattern, seed=0, counts_cache=counts),
            seq_len=SEQ_LEN,
            batch_size=BATCH,
            num_workers=WORKERS,
            packing=packing,
        )
        rows: list[list[tuple[str, Any, int, int]]] = []  # counted after the clock stops

        def epoch() -> Iterator[tuple[int, int]]:
            for batch in loader:
                rows.extend(batch["__segments__"])
                ids = batch["segment_ids"]
                yield ids.numel(), int((ids == 0).sum())

        found = timed(epoch(), loader.close)
        pieces = Counter((source, key) for spans in rows for source, key, _, _ in spans)
        return {**found, "dropped": 0, "cut": sum(count > 1 for count in pieces.values())}

    return run


def run_concat(paths: list[str]) -> Run:
    def run() -> dict[str, float]:
        loader = DataLoader(ConcatChunk(paths), batch_size=BATCH, num_workers=WORKERS)
        found = timed(((b.numel(), int((b == -1).sum())) for b in loader), lambda: None)
        # The cut documents, from the same concatenation of each worker's shards.
        pieces = Counter(
            (worker, document)
            for worker in range(WORKERS)
            for row in concat(
                [len(t) for path in paths[worker::WORKERS] for t in tar_documents(path)], SEQ_LEN
            )
            for document, _, _ in row
        )
        return {**found, "dropped": 0, "cut": sum(count > 1 for count in pieces.values())}

    return run


def write_litdata(paths: list[str], tokens: int, out: Path) -> None:
    """The shards' documents, in order, as LitData token chunks of about one shard's tokens.
    In a process of its own: ``optimize`` sets this process's multiprocessing start method to
    spawn (for the DataLoaders too) and prints its progress."""
    chunk = str(-(-tokens // len(paths)))
    command = [sys.executable, __file__, "--write-litdata", str(out), chunk, *paths]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"litdata.optimize failed:\n{done.stdout}\n{done.stderr}")


def _optimize(out: str, chunk: str, paths: list[str]) -> None:
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    optimize(
        fn=tar_documents,
        inputs=paths,
        output_dir=out,
        chunk_size=int(chunk),
        item_loader=TokensLoader(),
        num_workers=1,
        mode="overwrite",
    )


def litdata_layout(folder: Path) -> dict[str, int]:
    """From the chunk files' headers (item count, then byte offsets): the tokens
    ``TokensLoader(block_size=SEQ_LEN)`` drops (each chunk's tail past its last whole row) and
    the documents it cuts (across rows, or across a chunk's kept part and its dropped tail)."""
    dropped = cut = 0
    for chunk in json.loads((folder / "index.json").read_text())["chunks"]:
        with (folder / chunk["filename"]).open("rb") as file:
            (items,) = np.frombuffer(file.read(4), np.uint32)
            offsets = np.frombuffer(file.read(4 * (int(items) + 1)), np.uint32).astype(np.int64)
        width = (offsets[-1] - offsets[0]) // chunk["dim"]  # bytes per token
        bounds = (offsets - offsets[0]) // width
        starts, stops = bounds[:-1], bounds[1:]
        dropped += chunk["dim"] % SEQ_LEN
        cut += int(((stops - 1) // SEQ_LEN > starts // SEQ_LEN).sum())
    return {"dropped": dropped, "cut": cut}


def run_litdata(folder: Path) -> Run:
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import item_loader

    class TokensLoader(item_loader.TokensLoader):  # LitData checks the name
        """LitData's, but its chunks' memory maps stay open: LitData 0.2.60 closes a
        chunk's map when a worker moves to the next chunk, while rows read from the map still
        wait in the batch being built, and the worker segfaults when they are collated
        (Lightning-AI/litData#454, #756; it does so here within the first epoch)."""

        def close(self, chunk_index: int) -> None:
            pass

    layout = litdata_layout(folder)

    def run() -> dict[str, float]:
        dataset = StreamingDataset(
            str(folder), item_loader=TokensLoader(block_size=SEQ_LEN), shuffle=True
        )
        loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
        found = timed(((batch.numel(), 0) for batch in loader), lambda: None)
        return {**found, **layout}

    return run


def have_litdata() -> bool:
    try:
        import litdata  # noqa: F401
    except ImportError:
        return False
    return True


def measure(rounds: int, shards: int, documents: int, root: Path) -> dict[str, Any]:
    """Every side once per round, the order rotated each round: the data and each side's runs."""
    pattern, written = write_token_shards(root / "tar", shards, documents, mean_log=5.0)
    paths = sorted({path for path, _ in written})
    tokens = sum(len(t) for t in written.values())
    counts = root / "record-counts.json"
    len(MixingLoader(ShardDataset(pattern, counts_cache=counts), batch_size=BATCH))  # writes it
    runs: dict[str, Run] = {
        OURS: run_tokenloader(pattern, counts, "best_fit"),
        "TokenLoader concat": run_tokenloader(pattern, counts, "concat"),
        "concat-and-chunk DataLoader": run_concat(paths),
    }
    if have_litdata():
        write_litdata(paths, tokens, root / "litdata")
        runs[LITDATA] = run_litdata(root / "litdata")
    found: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    names = list(runs)
    for number in range(rounds):
        shift = number % len(names)
        for name in [*names[shift:], *names[:shift]]:
            found[name].append(runs[name]())
    return {
        "documents": len(written),
        "tokens": tokens,
        "longer": sum(len(t) > SEQ_LEN for t in written.values()),
        "shards": shards,
        "rounds": rounds,
        "runs": found,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def summary(measured: dict[str, Any]) -> dict[str, Any]:
    """Per side the medians and ranges of its figures; shardmix's over LitData's per round."""
    tokens, documents = measured["tokens"], measured["documents"]
    sides: dict[str, Any] = {}
    for name, runs in measured["runs"].items():
        first = runs[0]
        sides[name] = {
            "tokens_per_s": _spread([r["delivered"] / r["seconds"] for r in runs]),
            "first_batch_s": _spread([r["first"] for r in runs]),
            "after_first_tokens_per_s": _spread([r["after_first"] for r in runs]),
            "main_us_per_token": _spread([r["main"] / r["delivered"] * 1e6 for r in runs]),
            "total_us_per_token": _spread(
                [(r["main"] + r["workers"]) / r["delivered"] * 1e6 for r in runs]
            ),
            "padding_share": first["padding"] / tokens,
            "cut_share": first["cut"] / documents,
            "dropped_share": first["dropped"] / tokens,
            "every_token": all(r["delivered"] == tokens - r["dropped"] for r in runs),
        }
    ratios = {}
    if LITDATA in measured["runs"]:
        ours, theirs = measured["runs"][OURS], measured["runs"][LITDATA]
        pairs = list(zip(ours, theirs, strict=True))
        ratios = {
            "tokens_per_s": _spread(
                [a["delivered"] / a["seconds"] / (b["delivered"] / b["seconds"]) for a, b in pairs]
            ),
            "after_first_tokens_per_s": _spread(
                [a["after_first"] / b["after_first"] for a, b in pairs]
            ),
            "main_us_per_token": _spread(
                [a["main"] / a["delivered"] / (b["main"] / b["delivered"]) for a, b in pairs]
            ),
        }
    return {**{k: v for k, v in measured.items() if k != "runs"}, "sides": sides, "ratios": ratios}


def _figure(spread: dict[str, float], spec: str) -> str:
    return f"{spread['median']:{spec}} ({spread['low']:{spec}}-{spread['high']:{spec}})"


def report_lines(found: dict[str, Any]) -> list[str]:
    """The setting, one line per side, and shardmix's ratio over LitData."""
    lines = [
        f"{found['shards']} tar shards, {found['documents']:,} documents, {found['tokens']:,} "
        f"uint16 tokens ({found['longer']} documents longer than {SEQ_LEN}); seq_len {SEQ_LEN}, "
        f"batch {BATCH}, {WORKERS} workers; medians (ranges) of {found['rounds']} interleaved "
        "rounds"
    ]
    for name, side in found["sides"].items():
        lines.append(
            f"{name}: {_figure(side['tokens_per_s'], ',.0f')} tokens/s (first batch after "
            f"{_figure(side['first_batch_s'], '.2f')} s, then "
            f"{_figure(side['after_first_tokens_per_s'], ',.0f')} tokens/s); main process "
            f"{_figure(side['main_us_per_token'], '.3f')} µs/token; all processes "
            f"{_figure(side['total_us_per_token'], '.3f')} µs/token; padding "
            f"{side['padding_share']:.4%}; cut {side['cut_share']:.2%} of documents; dropped "
            f"{side['dropped_share']:.4%} of tokens; "
            + ("every token delivered" if side["every_token"] else "TOKENS MISSING")
        )
    ratios = found["ratios"]
    if ratios:
        lines.append(
            f"{OURS} / {LITDATA}, per round: tokens/s {_figure(ratios['tokens_per_s'], '.2f')}x "
            f"(after the first batch {_figure(ratios['after_first_tokens_per_s'], '.2f')}x), "
            f"main-process CPU per token {_figure(ratios['main_us_per_token'], '.2f')}x"
        )
    else:
        lines.append(f"{LITDATA} skipped: litdata is not installed (see tools/bench_tokens.py)")
    return lines


def rows(rounds: int = 5, shards: int = 16, documents: int = 10_000) -> list[dict[str, Any]]:
    """``tools/bench.py``'s rows: one per side, its note a line of :func:`report_lines`."""
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as scratch:
        found = summary(measure(rounds, shards, documents, Path(scratch)))
    lines = report_lines(found)
    out = []
    for at, (name, side) in enumerate(found["sides"].items()):
        note = next(line for line in lines if line.startswith(name + ":"))
        if at == 0:
            note = f"{lines[0]}; {note}; {lines[-1]}"
        out.append(
            {
                "section": "tokens",
                "system": name,  # the notes carry the ratios, per round
                "name": name,
                "samples": found["tokens"],
                "seconds": float("nan"),
                "samples_per_s": float("nan"),  # tokens, not samples: the notes say
                "mean_samples_per_s": float("nan"),
                "distinct_per_batch": float("nan"),
                "ideal_distinct": float("nan"),
                "exactly_once": side["every_token"],
                "note": note,
                "extra": side,
            }
        )
    return out


def section_run(row: Callable[..., Any]) -> Callable[[Any], list[Any]]:
    """``tools/bench.py``'s section function, building its ``row`` type from :func:`rows`."""
    return lambda config: [row(**found) for found in rows()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--documents", type=int, default=10_000, help="documents per shard")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    parser.add_argument("--write-litdata", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_litdata:
        _optimize(args.write_litdata[0], args.write_litdata[1], args.write_litdata[2:])
        return
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as scratch:
        found = summary(measure(args.rounds, args.shards, args.documents, Path(scratch)))
    print(json.dumps(found, indent=1) if args.json else "\n".join(report_lines(found)))


if __name__ == "__main__":
    main()
