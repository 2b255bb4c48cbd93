"""inspect: the report's counts against the loader's own batches, the ideal, the baseline."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest
from torch.utils.data import get_worker_info

from shardmix import MixingLoader, ShardDataset
from shardmix.cli.main import main
from shardmix.inspect import INSPECT_SCHEMA_VERSION, ideal_distinct_sources, inspect_batches
from shardmix.loader import DEFAULT_SHUFFLE_BUFFER_BYTES
from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS
from shardmix.plan.urls import expand_urls


def inspect_json(capsys, *args: str) -> dict:
    assert main(["inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def tag_worker(sample: dict) -> dict:
    info = get_worker_info()
    return {**sample, "worker": 0 if info is None else info.id}


def loader_batches(pattern: str, **settings) -> list[tuple[Counter, list[int]]]:
    """Per batch, straight from a MixingLoader: samples per source and per worker."""
    seed = settings.pop("seed", 0)
    workers = max(1, settings["num_workers"])
    dataset = ShardDataset(pattern, seed=seed, transform=tag_worker)
    found = []
    for batch in MixingLoader(dataset, seed=seed, **settings):
        per_worker = Counter(batch["worker"].tolist())
        found.append((Counter(batch["__source__"]), [per_worker[w] for w in range(workers)]))
    return found


@pytest.mark.parametrize(
    ("batch_size", "num_workers", "shuffle_buffer", "seed"),
    [(16, 0, 0, 0), (32, 2, 100, 3)],
)
def test_json_counts_equal_the_loaders_batches(
    capsys, shard_set, batch_size, num_workers, shuffle_buffer, seed
):
    report = inspect_json(
        capsys,
        shard_set,
        f"--batch-size={batch_size}",
        f"--num-workers={num_workers}",
        f"--shuffle-buffer={shuffle_buffer}",
        f"--seed={seed}",
    )
    expected = loader_batches(
        shard_set,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle_buffer=shuffle_buffer,
        seed=seed,
    )
    assert [Counter(b["sources"]) for b in report["batches"]] == [s for s, _ in expected]
    assert [b["workers"] for b in report["batches"]] == [w for _, w in expected]
    for batch in report["batches"]:
        counts = batch["sources"].values()
        assert batch["size"] == sum(counts) == sum(batch["lanes"]) == sum(batch["workers"])
        assert batch["distinct_sources"] == len(batch["sources"])
        assert batch["largest_share"] == max(counts) / batch["size"]
    assert report["summary"]["samples"] == sum(report["shards"].values())
    assert report["schema_version"] == INSPECT_SCHEMA_VERSION == 3
    assert report["baseline"] is None
    stats = report["loader_stats"]
    shard_bytes = sum(os.path.getsize(url) for url in expand_urls(shard_set))
    assert (stats["steps"], list(stats["bytes"])) == (len(expected), ["file://"])
    # Every byte of every shard read; pieces of a shard each read from a window at their start,
    # so a shard read as pieces is read somewhat more than once in all.
    assert shard_bytes <= stats["bytes"]["file://"] <= 1.6 * shard_bytes
    assert (stats["requests"], stats["lane_stalls"], stats["cache_misses"]) == ({}, 0, 0)


def test_json_on_64_shards_with_a_batch_limit(capsys, shards64):
    pattern, sizes = shards64
    report = inspect_json(capsys, pattern, "--batch-size=48", "--batches=7", "--seed=5")
    expected = loader_batches(pattern, batch_size=48, num_workers=0, shuffle_buffer=8192, seed=5)[
        :7
    ]
    assert [Counter(b["sources"]) for b in report["batches"]] == [s for s, _ in expected]
    summary = report["summary"]
    distinct = [len(s) for s, _ in expected]
    assert summary["batches"] == 7
    assert summary["mean_distinct_sources"] == pytest.approx(sum(distinct) / 7)
    assert summary["min_distinct_sources"] == min(distinct)
    assert summary["max_distinct_sources"] == max(distinct)
    histogram = {h["distinct_sources"]: h["batches"] for h in summary["histogram"]}
    assert histogram == Counter(distinct)
    assert summary["ideal_distinct_sources"] == pytest.approx(ideal_distinct_sources(sizes, 48))
    assert sorted(report["shards"].values()) == sorted(sizes)
    assert report["settings"] == {
        "num_shards": 64,
        "batch_size": 48,
        "num_workers": 0,
        "num_lanes": 64,  # the default for batch 48: one lane per shard, at most 3 x 48
        "shuffle_buffer": 8192,
        "shuffle_buffer_bytes": DEFAULT_SHUFFLE_BUFFER_BYTES,
        "seed": 5,
        "epoch": 0,
        "batches": 7,
        "rank": 0,
        "world_size": 1,
        "even_ranks": "drop",
        "piece_records": DEFAULT_PIECE_RECORDS,
        "label": None,
    }


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_each_rank_equals_the_loader_at_that_rank(capsys, shards64, even_ranks):
    pattern, _ = shards64
    seen: list[set[str]] = []
    lengths = set()
    for rank in range(3):
        args = ["--batch-size=20", "--seed=1", f"--rank={rank}", "--world-size=3"]
        report = inspect_json(capsys, pattern, *args, f"--even-ranks={even_ranks}")
        expected = loader_batches(
            pattern,
            batch_size=20,
            num_workers=0,
            shuffle_buffer=8192,
            seed=1,
            rank=rank,
            world_size=3,
            even_ranks=even_ranks,
        )
        assert [Counter(b["sources"]) for b in report["batches"]] == [s for s, _ in expected]
        dataset = ShardDataset(pattern, seed=1)
        plan = dataset.plan.lane_shards(0, rank=rank, world_size=3)
        assert set(report["shards"]) == {dataset.urls[i] for lane in plan for i in lane}
        assert {url for b in report["batches"] for url in b["sources"]} <= set(report["shards"])
        seen.append(set(report["shards"]))
        lengths.add(report["summary"]["samples"])
    assert len(set().union(*seen)) == 64
    assert sum(len(s) for s in seen) - 64 <= 2  # a shard split between two ranks is in both
    assert len(lengths) == 1  # every rank takes the same number of steps


def test_compare_shows_the_plain_dataloader_near_one_file_per_batch(capsys, shards64):
    pattern, _ = shards64
    report = inspect_json(
        capsys, pattern, "--batch-size=32", "--num-workers=2", "--shuffle-buffer=0", "--compare"
    )
    baseline = report["baseline"]
    assert baseline["loader"] == "DataLoader"
    assert baseline["summary"]["samples"] == report["summary"]["samples"]
    assert baseline["summary"]["mean_distinct_sources"] < 2.5
    assert (
        report["summary"]["mean_distinct_sources"]
        > 4 * baseline["summary"]["mean_distinct_sources"]
    )
    # Each plain DataLoader batch is what one worker read.
    assert all(sorted(b["workers"])[0] == 0 for b in baseline["batches"])


def test_text_report_shows_first_and_last_batches_and_the_summary(capsys, shards64):
    pattern, _ = shards64
    assert main(["inspect", pattern, "--batch-size=16", "--shuffle-buffer=0", "--compare"]) == 0
    out = capsys.readouterr().out
    assert "batches not shown" in out
    assert "uniformly random ideal" in out
    assert "MixingLoader" in out and "DataLoader" in out
    assert "histogram MixingLoader" in out
    assert re.search(r"data: waited \d+\.\d+ s over \d+ steps \(.* MB/s from file://", out)


def test_bad_settings_exit_non_zero_with_a_message(capsys, shards64):
    pattern, _ = shards64
    assert main(["inspect", pattern, "--rank=2", "--world-size=2"]) == 2
    assert "rank 2 is outside world_size 2" in capsys.readouterr().err


@pytest.mark.parametrize(("records", "batch_size"), [([3, 1, 4, 1, 5], 4), ([2, 7, 0, 6], 9)])
def test_ideal_is_the_exact_expectation(records, batch_size):
    owners = [shard for shard, size in enumerate(records) for _ in range(size)]
    draws = list(combinations(range(len(owners)), batch_size))
    exact = sum(len({owners[i] for i in draw}) for draw in draws) / len(draws)
    assert ideal_distinct_sources(records, batch_size) == pytest.approx(exact, rel=1e-12)
    assert math.isclose(ideal_distinct_sources(records, 10_000), sum(map(bool, records)))


def test_library_report_matches_its_json(shards64):
    pattern, sizes = shards64
    report = inspect_batches(pattern, batch_size=40, shuffle_buffer=64, compare=True)
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data  # plain JSON types only
    assert [b.sources for b in report.batches] == [b["sources"] for b in data["batches"]]
    assert report.summary.samples == sum(sizes) == data["summary"]["samples"]
    assert report.baseline is not None and report.baseline.summary.samples == sum(sizes)
    fields = {"loader", "num_lanes", "num_workers", "batches", "summary", "loader_stats", "order"}
    assert set(data["baseline"]) == fields and data["baseline"]["loader_stats"] is None


def test_share_per_tenth_covers_the_batches_in_order(shards64):
    pattern, sizes = shards64
    report = inspect_batches(pattern, batch_size=24, shuffle_buffer=50, num_lanes=8)
    summary = report.summary
    batches = report.batches
    assert [t.first_batch for t in summary.tenths] == [i * len(batches) // 10 for i in range(10)]
    assert sum(t.batches for t in summary.tenths) == len(batches)
    for tenth in summary.tenths:
        part = batches[tenth.first_batch : tenth.first_batch + tenth.batches]
        ideal = sum(ideal_distinct_sources(sizes, b.size) for b in part)
        assert tenth.share_of_ideal == pytest.approx(sum(b.distinct_sources for b in part) / ideal)
    ideal = sum(ideal_distinct_sources(sizes, b.size) for b in batches)
    assert summary.share_of_ideal == pytest.approx(sum(b.distinct_sources for b in batches) / ideal)
    data = report.to_dict()["summary"]
    assert [t["share_of_ideal"] for t in data["tenths"]] == [
        t.share_of_ideal for t in summary.tenths
    ]


def test_advice_names_the_setting_with_the_figure_a_real_run_gives(capsys, shards64):
    pattern, _ = shards64
    settings = {"batch_size": 32, "num_lanes": 2, "shuffle_buffer": 32}
    report = inspect_batches(pattern, **settings)
    advice = report.advice
    assert advice is not None and advice.low
    assert advice.share_of_ideal == report.summary.share_of_ideal < 0.9
    lanes = [s for s in advice.suggestions if s.setting == "num_lanes"]
    assert [s.value for s in lanes] == [64]  # the default for batch 32 on 64 shards
    rerun = inspect_batches(pattern, **{**settings, "num_lanes": 64}, advise=False)
    assert rerun.advice is None
    assert lanes[0].share_of_ideal == rerun.summary.share_of_ideal >= 0.9
    assert lanes[0].min_tenth_share == rerun.summary.min_tenth_share
    for suggestion in advice.suggestions:  # every figure is a real run's
        changed = {**settings, suggestion.setting: suggestion.value}
        again = inspect_batches(pattern, **changed, advise=False).summary
        assert suggestion.share_of_ideal == again.share_of_ideal
    defaults = inspect_batches(pattern, batch_size=32, advise=False).summary
    assert advice.defaults is not None
    assert advice.defaults.share_of_ideal == defaults.share_of_ideal
    assert "num_lanes=64 would give" in advice.messages[1]
    assert any("lower than the defaults would" in m for m in advice.messages)

    args = ["--batch-size=32", "--num-lanes=2", "--shuffle-buffer=32"]
    assert main(["inspect", pattern, *args]) == 0
    out = capsys.readouterr().out
    assert "advice:" in out and "batches mix poorly" in out
    assert f"num_lanes=64 would give {lanes[0].share_of_ideal:.2f}" in out


def test_lanes_not_read_by_size_advise_record_counts(shards64):
    pattern, sizes = shards64
    gzipped = []  # gzip shards: no byte sizes to read lanes by, and no counts given
    for url in expand_urls(pattern):
        target = Path(url).with_name(Path(url).name + ".gz")
        if not target.exists():
            with open(url, "rb") as source, gzip.open(target, "wb") as sink:
                shutil.copyfileobj(source, sink)
        gzipped.append(str(target))
    # Lanes taken in turn, not by size: the short lanes end first and the tail mixes worse.
    settings = {"batch_size": 16, "num_lanes": 16, "shuffle_buffer": 0}
    report = inspect_batches(gzipped, **settings)
    advice = report.advice
    assert advice is not None and advice.low
    assert advice.min_tenth_share == report.summary.tenths[-1].share_of_ideal < 0.8
    counted = [s for s in advice.suggestions if s.setting == "record_counts"]
    assert counted and counted[0].min_tenth_share >= 0.8, advice.messages
    counts = dict(zip(gzipped, sizes, strict=True))
    again = inspect_batches(gzipped, **settings, record_counts=counts, advise=False)
    assert counted[0].share_of_ideal == again.summary.share_of_ideal
    assert "shardmix convert" in counted[0].how


def test_no_advice_at_the_defaults_on_a_well_mixed_set(capsys, shards64):
    pattern, _ = shards64
    report = inspect_batches(pattern, batch_size=32, num_workers=2)
    assert report.advice is not None
    assert not report.advice.low and report.advice.suggestions == []
    assert report.advice.defaults is None and report.advice.messages == []
    assert report.summary.share_of_ideal >= 0.9
    assert min(t.share_of_ideal for t in report.summary.tenths) >= 0.8
    assert main(["inspect", pattern, "--batch-size=32"]) == 0
    assert "advice" not in capsys.readouterr().out
