"""Token shards for the tests: documents of log-normal lengths, some longer than ``seq_len``."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np

from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def write_token_shards(
    directory: Path,
    shards: int,
    documents: int,
    *,
    fmt: str = "tar",
    mean_log: float = 5.0,
    dtype: type = np.uint16,
    seed: int = 0,
) -> tuple[str, dict[tuple[str, str], np.ndarray]]:
    """Write ``shards`` shards of ``documents`` documents each; return the brace pattern and
    every document's tokens by ``(shard path, key)``."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = {}
    for shard in range(shards):
        path = str(directory / f"tok-{shard:04d}.{fmt}")
        writer = TarWriter(path) if fmt == "tar" else TFRecordWriter(path)
        with writer:
            for record in range(documents):
                key = f"s{shard:03d}r{record:05d}"
                length = max(1, int(rng.lognormal(mean_log, 1.0)))
                tokens = rng.integers(0, 50_000, length).astype(dtype)
                written[path, key] = tokens
                if fmt == "tar":
                    writer.write({"__key__": key, "tokens.npy": npy(tokens)})
                else:
                    writer.write_example({"__key__": key, "tokens": tokens.astype(np.int64)})
    return str(directory / f"tok-{{0000..{shards - 1:04d}}}.{fmt}"), written


def assert_tiles(batches: list[dict], documents: dict[tuple[str, str], np.ndarray]) -> None:
    """Every document's tokens appear exactly once: the spans tile each document, and
    ``input_ids`` hold exactly the tokens the spans name."""
    seen: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for batch in batches:
        ids = batch["input_ids"].numpy()
        for row, spans in enumerate(batch["__segments__"]):
            at = 0
            for source, key, start, stop in spans:
                expected = documents[source, key][start:stop].astype(np.int64)
                assert (ids[row, at : at + stop - start] == expected).all(), (source, key)
                seen.setdefault((source, key), []).append((start, stop))
                at += stop - start
    assert set(seen) == set(documents)
    for name, spans in seen.items():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == len(documents[name]), name
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), name


def check_every_token_once(
    spans: list, documents: dict, dropped: int, world_size: int, seq_len: int
) -> None:
    """No token of ``spans`` ``(shard, key, start, stop)`` twice, and the missing ones are
    exactly the ``dropped`` tokens of the fewer than ``world_size`` rows that
    ``even_ranks="drop"`` left at the epoch's end: no document is left unread."""
    seen = Counter((s, k, at) for s, k, a, b in spans for at in range(a, b))
    assert max(seen.values()) == 1
    assert set(seen) <= {
        (*name, at) for name, tokens in documents.items() for at in range(len(tokens))
    }
    missing = sum(len(tokens) for tokens in documents.values()) - len(seen)
    assert missing == dropped
    assert 0 <= dropped < world_size * seq_len
