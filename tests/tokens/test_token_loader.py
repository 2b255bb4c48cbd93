"""TokenLoader: every token once, little padding, ids as specified, rows independent of
``num_workers`` and of a resume, unreadable token fields named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from token_shards import assert_tiles, npy, write_token_shards

from shardmix import ShardDataset
from shardmix.errors import ConfigError, DecodeError
from shardmix.formats.tar_writer import TarWriter
from shardmix.tokens import TokenLoader, cu_seqlens


def rows_of(batches: list[dict]) -> list[tuple]:
    return [
        (tuple(ids.tolist()), tuple(spans))
        for batch in batches
        for ids, spans in zip(batch["input_ids"], batch["__segments__"], strict=True)
    ]


@pytest.mark.parametrize("packing", ["best_fit", "concat"])
@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_spans_tile_every_document_once(tmp_path, packing, fmt):
    pattern, documents = write_token_shards(tmp_path, 6, 80, fmt=fmt, mean_log=3.5)
    loader = TokenLoader(
        ShardDataset(pattern, seed=1), seq_len=64, batch_size=4, window=100, packing=packing
    )
    batches = list(loader)
    assert_tiles(batches, documents)
    assert all(batch["input_ids"].shape == (4, 64) for batch in batches[:-1])


def test_ids_restart_at_every_piece(tmp_path):
    pattern, _ = write_token_shards(tmp_path, 4, 60, mean_log=3.5)
    for batch in TokenLoader(ShardDataset(pattern), seq_len=64, batch_size=3, window=50):
        assert batch["input_ids"].dtype == torch.int64
        assert batch["segment_ids"].dtype == torch.int32
        for row, spans in enumerate(batch["__segments__"]):
            at = 0
            for segment, (_, _, start, stop) in enumerate(spans, 1):
                n = stop - start
                assert batch["position_ids"][row, at : at + n].tolist() == list(range(n))
                assert (batch["segment_ids"][row, at : at + n] == segment).all()
                at += n
            assert (batch["segment_ids"][row, at:] == 0).all()
        bounds = cu_seqlens(batch["segment_ids"])
        assert bounds[-1] == batch["segment_ids"].numel()


def test_padding_is_a_window_end_only(tmp_path):
    pattern, documents = write_token_shards(tmp_path, 8, 1000, mean_log=5.0)
    assert sum(len(tokens) > 1024 for tokens in documents.values()) > 100
    batches = list(TokenLoader(ShardDataset(pattern, seed=2), seq_len=1024, batch_size=8))
    assert_tiles(batches, documents)
    padding = sum(int((batch["segment_ids"] == 0).sum()) for batch in batches[:-1])
    tokens = sum(len(tokens) for tokens in documents.values())
    assert padding <= 0.0005 * tokens
    shards = {source for spans in batches[0]["__segments__"] for source, *_ in spans}
    assert len(shards) == 8  # rows mix documents of every shard


def test_rows_do_not_depend_on_workers_or_a_resume(tmp_path):
    pattern, documents = write_token_shards(tmp_path, 6, 100, mean_log=3.5)

    def loader(workers: int) -> TokenLoader:
        dataset = ShardDataset(pattern, seed=4)
        return TokenLoader(dataset, seq_len=64, batch_size=4, window=150, num_workers=workers)

    whole = list(loader(1))
    assert rows_of(list(loader(2))) == rows_of(whole)
    assert_tiles(whole, documents)
    for stop in (1, 7, len(whole) // 2, len(whole) - 1):
        first = loader(2)
        head = []
        for batch in first:
            head.append(batch)
            if len(head) == stop:
                break
        state = first.state_dict()
        first.close()
        resumed = loader(0)
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
        assert rows_of(head + list(resumed)) == rows_of(whole), stop


def test_state_refusals(tmp_path):
    pattern, _ = write_token_shards(tmp_path, 2, 20, mean_log=3.0)
    loader = TokenLoader(ShardDataset(pattern), seq_len=64, batch_size=2)
    state = loader.state_dict()
    other = TokenLoader(ShardDataset(pattern), seq_len=32, batch_size=2)
    with pytest.raises(ConfigError, match="seq_len"):
        other.load_state_dict(state)
    old = {"tokens": {**state["tokens"], "version": 0}}
    with pytest.raises(ConfigError, match="version 0"):
        loader.load_state_dict(old)
    with pytest.raises(ConfigError, match="no 'tokens' part"):
        loader.load_state_dict({"version": 1})


def write_damaged(path: str) -> None:
    with TarWriter(path) as writer:
        writer.write({"__key__": "good", "tokens.npy": npy(np.arange(5, dtype=np.uint32))})
        writer.write({"__key__": "text", "txt": b"no tokens"})
        writer.write({"__key__": "float", "tokens.npy": npy(np.ones(3))})
        writer.write({"__key__": "square", "tokens.npy": npy(np.ones((2, 2), np.int32))})
        writer.write({"__key__": "last", "tokens.npy": npy(np.arange(3, dtype=np.uint16))})


def test_unreadable_token_fields_are_named_or_skipped(tmp_path):
    path = str(tmp_path / "bad.tar")
    write_damaged(path)
    with pytest.raises(DecodeError, match=r"record 1 \(key 'text', byte offset \d+\) of .*bad.tar"):
        list(TokenLoader(ShardDataset(path), seq_len=4, batch_size=1, shuffle_buffer=0))
    loader = TokenLoader(
        ShardDataset(path, on_error="skip"), seq_len=4, batch_size=1, shuffle_buffer=0
    )
    spans = [s for batch in loader for row in batch["__segments__"] for s in row]
    assert sorted({key for _, key, _, _ in spans}) == ["good", "last"]
    assert loader.skipped == 3


def test_len_is_estimated_from_the_tokens_read(tmp_path):
    pattern, _ = write_token_shards(tmp_path, 4, 300, mean_log=4.0)
    loader = TokenLoader(ShardDataset(pattern), seq_len=128, batch_size=4, window=256)
    with pytest.raises(TypeError, match="first batch"):
        len(loader)
    actual = sum(
        1 for _ in TokenLoader(ShardDataset(pattern), seq_len=128, batch_size=4, window=256)
    )
    batches = iter(loader)
    next(batches)
    # One window's mean of 256 log-normal lengths (sigma 1) errs by about 8%; the estimate
    # sharpens as the windows are read.
    assert abs(len(loader) - actual) <= 0.15 * actual
    for _ in range(actual // 2):
        next(batches)
    assert abs(len(loader) - actual) <= 0.05 * actual


def test_an_array_in_a_npy_field_is_written_as_npy(tmp_path):
    from shardmix import write_shards

    tokens = np.arange(70_000, 70_010, dtype=np.uint32)
    write_shards([{"__key__": "a", "tokens.npy": tokens}], str(tmp_path / "p-%04d.tar"))
    batch = next(
        iter(TokenLoader(ShardDataset(str(tmp_path / "p-0000.tar")), seq_len=10, batch_size=1))
    )
    assert batch["input_ids"][0].tolist() == tokens.tolist()
