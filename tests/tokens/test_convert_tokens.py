"""``convert`` with a tokenizer: JSON Lines, Parquet and text folders become token shards whose
every document holds exactly ``tokenizer.encode(text).ids`` (+ EOS), counted in the manifest,
and that TokenLoader reads whole, every token once."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from token_shards import assert_tiles
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from shardmix import ShardDataset
from shardmix.cli.main import main
from shardmix.convert import (
    BadInputError,
    ConvertOptions,
    TokenOptions,
    convert,
    read_manifest,
)
from shardmix.convert.manifest import Journal, ShardEntry
from shardmix.errors import ConfigError
from shardmix.formats import Format, reader_for
from shardmix.plan.manifests import local_entries
from shardmix.sources import open_shard
from shardmix.tokens import TokenLoader
from shardmix.tokens.documents import document_tokens

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "dogs",
    "ran",
    "past",
    "every",
    "red",
    "house",
    "near",
    "blue",
    "rivers",
]


def text(n: int) -> str:
    """Document ``n``: 1 to 60 words, some unknown to the tokenizer."""
    rng = np.random.default_rng(n)
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), 1 + n % 60)]
    return " ".join(words) + (" zebra" if n % 5 == 0 else "")


@pytest.fixture
def tokenizer(tmp_path) -> tuple[str, Tokenizer]:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"])
    tok.train_from_iterator([" ".join(WORDS)], trainer)
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    return path, tok


@pytest.fixture
def inputs(tmp_path) -> tuple[list[str], dict[str, str]]:
    """A JSON Lines table, a Parquet table and a folder of text files; every key's text."""
    texts: dict[str, str] = {}
    with open(tmp_path / "web.jsonl", "w") as file:
        for row in range(150):
            file.write(json.dumps({"text": text(row), "url": f"u{row}"}) + "\n")
            texts[f"web/{row:08d}"] = text(row)
    rows = [text(1000 + row) for row in range(120)]
    pq.write_table(pa.table({"text": rows, "n": list(range(120))}), tmp_path / "books.parquet")
    texts |= {f"books/{row:08d}": value for row, value in enumerate(rows)}
    folder = tmp_path / "essays"
    folder.mkdir()
    for number in range(40):
        suffix = "md" if number % 2 else "txt"
        (folder / f"essay{number:03d}.{suffix}").write_text(text(2000 + number))
        texts[f"essay{number:03d}"] = text(2000 + number)
    paths = [str(tmp_path / "web.jsonl"), str(tmp_path / "books.parquet"), str(folder)]
    return paths, texts


def read_documents(folder: str, fmt: Format) -> dict[tuple[str, str], np.ndarray]:
    """Every written document's tokens by (shard path, key), as TokenLoader reads them."""
    manifest = read_manifest(os.path.join(folder, "tok.manifest.json"))
    found = {}
    for shard in manifest.shards:
        url = os.path.join(folder, shard.name)
        with open_shard(url) as stream:
            for _, _, sample in reader_for(fmt).records(stream, url):
                found[url, sample["__key__"]] = document_tokens(sample, "tokens")
    return found


@pytest.mark.parametrize("fmt", [Format.TAR, Format.TFRECORD])
def test_documents_hold_exactly_their_tokens(tmp_path, tokenizer, inputs, fmt):
    path, tok = tokenizer
    paths, texts = inputs
    out = tmp_path / "out"
    options = ConvertOptions(max_records=37, workers=2, tokens=TokenOptions(path, append_eos=True))
    summary = convert(paths, f"{out}/tok-%04d.{fmt.value}", options)
    eos = tok.token_to_id("</s>")
    expected = {key: tok.encode(value).ids + [eos] for key, value in texts.items()}
    documents = read_documents(str(out), fmt)
    assert {key: tokens.tolist() for (_, key), tokens in documents.items()} == expected
    assert len(documents) == len(expected)
    if fmt is Format.TAR:
        assert {tokens.dtype for tokens in documents.values()} == {np.dtype(np.uint16)}
    manifest = read_manifest(str(out / "tok.manifest.json"))
    total = sum(len(ids) for ids in expected.values())
    assert summary.tokens == manifest.tokens == total
    for shard in manifest.shards:
        url = str(out / shard.name)
        lengths = [len(tokens) for (source, _), tokens in documents.items() if source == url]
        assert list(shard.record_tokens) == lengths  # in record order
        assert shard.tokens == sum(lengths)
    assert {name: entry.tokens for name, entry in local_entries(str(out)).items()} == {
        shard.name: shard.tokens for shard in manifest.shards
    }
    pattern = f"{out}/tok-{{0000..{len(manifest.shards) - 1:04d}}}.{fmt.value}"
    loader = TokenLoader(ShardDataset(pattern, seed=3), seq_len=32, batch_size=4, window=64)
    assert_tiles(list(loader), documents)


@pytest.mark.parametrize("world_size", [1, 2])
def test_len_comes_from_the_manifests_token_counts_before_any_batch(
    tmp_path, tokenizer, inputs, world_size
):
    path, _ = tokenizer
    paths, _ = inputs
    out = tmp_path / "out"
    convert(paths, f"{out}/tok-%04d.tar", ConvertOptions(max_records=37, tokens=TokenOptions(path)))
    manifest = read_manifest(str(out / "tok.manifest.json"))
    pattern = f"{out}/tok-{{0000..{len(manifest.shards) - 1:04d}}}.tar"
    ranks = [
        TokenLoader(
            ShardDataset(pattern, seed=3),
            seq_len=16,
            batch_size=4,
            window=512,
            rank=rank,
            world_size=world_size,
        )
        for rank in range(world_size)
    ]
    rows = -(-manifest.tokens // 16)  # every rank's, before the padding
    assert [len(loader) for loader in ranks] == [-(-(rows // world_size) // 4)] * world_size
    for loader in ranks:
        batches = list(loader)
        # Short only by the padding of the windows' last rows: a batch at most, here.
        assert 0 <= len(batches) - len(loader) <= 1
        if world_size == 1:
            padding = sum(int((batch["segment_ids"] == 0).sum()) for batch in batches)
            yielded = sum(len(batch["input_ids"]) for batch in batches)
            assert yielded * 16 == manifest.tokens + padding


def test_text_is_dropped_unless_kept(tmp_path, tokenizer, inputs):
    path, _ = tokenizer
    paths, _ = inputs
    tokens = TokenOptions(path, keep_columns=("text", "url"))
    convert(paths[0], f"{tmp_path}/out/tok-%04d.tar", ConvertOptions(tokens=tokens))
    url = f"{tmp_path}/out/tok-0000.tar"
    with open_shard(url) as stream:
        samples = [sample for _, _, sample in reader_for(Format.TAR).records(stream, url)]
    assert {name for name in samples[7] if not name.startswith("__")} == {
        "tokens.npy",
        "text",
        "url",
    }
    assert samples[7]["text"] == text(7).encode() and samples[7]["url"] == b"u7"
    convert(paths[0], f"{tmp_path}/bare/tok-%04d.tar", ConvertOptions(tokens=TokenOptions(path)))
    bare = f"{tmp_path}/bare/tok-0000.tar"
    with open_shard(bare) as stream:
        _, _, first = next(iter(reader_for(Format.TAR).records(stream, bare)))
    assert {name for name in first if not name.startswith("__")} == {"tokens.npy"}


@pytest.mark.parametrize(
    ("row", "found"),
    [({"body": "no text here"}, "no such field"), ({"text": 42}, "a value of type int")],
)
def test_a_row_without_text_is_named_or_skipped(tmp_path, tokenizer, row, found):
    path, tok = tokenizer
    table = tmp_path / "rows.jsonl"
    lines = [{"text": "the cat"}, row, {"text": "a dog ran"}]
    table.write_text("".join(json.dumps(line) + "\n" for line in lines))
    options = ConvertOptions(tokens=TokenOptions(path))
    with pytest.raises(
        BadInputError, match=f"rows.jsonl: row 1: expected a text in 'text', found {found}"
    ):
        convert(str(table), f"{tmp_path}/out/tok-%04d.tar", options)
    skipping = ConvertOptions(tokens=TokenOptions(path), skip_bad=True, overwrite=True)
    summary = convert(str(table), f"{tmp_path}/out/tok-%04d.tar", skipping)
    assert summary.records == 2 and len(summary.skipped) == 1
    assert "row 1" in summary.skipped[0]
    documents = read_documents(f"{tmp_path}/out", Format.TAR)
    assert {key: t.tolist() for (_, key), t in documents.items()} == {
        "rows/00000000": tok.encode("the cat").ids,
        "rows/00000002": tok.encode("a dog ran").ids,
    }
    assert read_manifest(f"{tmp_path}/out/tok.manifest.json").shards[0].record_tokens == (2, 3)


def test_eos_from_the_option_or_refused(tmp_path, inputs):
    paths, _ = inputs
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    pattern = f"{tmp_path}/out/tok-%04d.tar"
    with pytest.raises(ConfigError, match="cannot tell the EOS token.*--eos-token"):
        convert(paths[0], pattern, ConvertOptions(tokens=TokenOptions(path, append_eos=True)))
    with pytest.raises(ConfigError, match="'<end>' is not in the tokenizer's vocabulary"):
        tokens = TokenOptions(path, append_eos=True, eos_token="<end>")
        convert(paths[0], pattern, ConvertOptions(tokens=tokens))
    tokens = TokenOptions(path, append_eos=True, eos_token="mat")
    convert(paths[0], pattern, ConvertOptions(tokens=tokens))
    documents = read_documents(f"{tmp_path}/out", Format.TAR)
    assert {int(t[-1]) for t in documents.values()} == {tok.token_to_id("mat")}
    with pytest.raises(ConfigError, match="cannot load a tokenizer"):
        convert(paths[0], pattern, ConvertOptions(tokens=TokenOptions(str(tmp_path / "no.json"))))


def test_a_saved_hugging_face_dataset(tmp_path, tokenizer):
    datasets = pytest.importorskip("datasets")
    path, tok = tokenizer
    texts = [text(3000 + row) for row in range(30)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "saved"))
    options = ConvertOptions(tokens=TokenOptions(path))
    convert(str(tmp_path / "saved"), f"{tmp_path}/out/tok-%04d.tar", options)
    documents = read_documents(f"{tmp_path}/out", Format.TAR)
    expected = {f"saved/{row:08d}": tok.encode(value).ids for row, value in enumerate(texts)}
    assert {key: tokens.tolist() for (_, key), tokens in documents.items()} == expected


def test_a_version_1_manifest_still_reads(tmp_path):
    shard = {"name": "a-0.tar", "records": 3, "bytes": 10240, "sha256": "00"}
    data = {"shardmix_manifest": 1, "format": "tar", "gzip": False, "index": False}
    data |= {"part": None, "parts": 1, "plan": "x", "classes": [], "shards": [shard]}
    (tmp_path / "a.manifest.json").write_text(json.dumps(data))
    manifest = read_manifest(str(tmp_path / "a.manifest.json"))
    assert manifest.records == 3 and manifest.tokens is None
    assert manifest.shards[0].tokens is None and manifest.shards[0].record_tokens is None
    assert local_entries(str(tmp_path))["a-0.tar"].records == 3


def test_a_resumed_run_keeps_the_token_counts(tmp_path):
    entry = ShardEntry("a-0.tar", 2, 10240, "00", 5, (2, 3))
    journal = Journal(str(tmp_path / ".a.manifest.json.journal"))
    journal.start("plan", [entry])
    journal.append(dataclasses.replace(entry, name="a-1.tar"))
    second = ShardEntry("a-1.tar", 2, 10240, "00", 5, (2, 3))
    assert journal.read("plan") == {"a-0.tar": entry, "a-1.tar": second}


def test_command_line(tmp_path, tokenizer, inputs, capsys):
    path, tok = tokenizer
    paths, texts = inputs
    argv = ["convert", paths[2], f"{tmp_path}/out/tok-%04d.tfrecord", "--tokenizer", path]
    assert main([*argv, "--append-eos", "--max-records", "16"]) == 0
    total = sum(len(tok.encode(texts[f"essay{n:03d}"]).ids) + 1 for n in range(40))
    assert f"40 records, {total:,} tokens" in capsys.readouterr().out
    assert main([*argv, "--append-eos", "--max-records", "16"]) == 0  # the same: nothing to do
    assert f"(0 written now), 40 records, {total:,} tokens" in capsys.readouterr().out
    assert main(["convert", paths[2], f"{tmp_path}/x/t-%04d.tar", "--append-eos"]) == 2
    assert "need --tokenizer" in capsys.readouterr().err
