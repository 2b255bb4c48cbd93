"""inspect's order: diversity and drift against a random order, recomputed from the loader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.cli.main import main
from shardmix.errors import TransformError
from shardmix.formats.tar_writer import TarWriter
from shardmix.inspect import inspect_batches
from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS

SHARDS = 32


@pytest.fixture(scope="module")
def sorted_set(tmp_path_factory) -> tuple[str, Counter]:
    """32 tar shards of 50-70 records, written in class order: shard s holds class s // 2."""
    directory = tmp_path_factory.mktemp("class_sorted")
    sizes = np.random.default_rng(32).integers(50, 71, size=SHARDS)
    for shard, size in enumerate(sizes):
        with TarWriter(directory / f"part-{shard:04d}.tar") as writer:
            for record in range(int(size)):
                key = f"s{shard:03d}r{record:05d}"
                writer.write({"__key__": key, "cls": str(shard // 2), "bin": b"x"})
    keys = Counter(f"s{s:03d}r{r:05d}" for s, size in enumerate(sizes) for r in range(size))
    return str(Path(directory) / f"part-{{0000..{SHARDS - 1:04d}}}.tar"), keys


def drift(values: np.ndarray) -> float:
    """Mean over tenths of the total variation distance from the whole's histogram."""
    names, codes = np.unique(values, return_inverse=True)
    whole = np.bincount(codes, minlength=len(names)) / len(codes)
    found = []
    for i in range(10):
        part = codes[i * len(codes) // 10 : (i + 1) * len(codes) // 10]
        found.append(
            0.5 * np.abs(np.bincount(part, minlength=len(names)) / len(part) - whole).sum()
        )
    return float(np.mean(found))


def distinct(values: np.ndarray, sizes: list[int]) -> float:
    bounds = np.cumsum([0, *sizes])
    return float(np.mean([len(set(values[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]))


def loader_order(pattern: str, keys: Counter, **settings) -> dict[str, dict[str, float]]:
    """Both numbers for sources and labels, from a MixingLoader's own batches."""
    dataset_options = {k: settings.pop(k) for k in ("num_lanes", "piece_records") if k in settings}
    dataset = ShardDataset(pattern, seed=0, **dataset_options)
    sources, labels, sizes, seen = [], [], [], Counter()
    for batch in MixingLoader(dataset, seed=0, **settings):
        sources += batch["__source__"]
        labels += [value.decode() for value in batch["cls"]]
        sizes.append(len(batch["__key__"]))
        seen.update(batch["__key__"])
    assert seen == keys  # every record once
    permutation = np.random.default_rng([0, 0]).permutation(len(sources))
    found = {}
    for name, values in (("sources", np.array(sources)), ("label", np.array(labels))):
        shuffled = values[permutation]
        found[name] = {
            "mean_distinct": distinct(values, sizes),
            "random_mean_distinct": distinct(shuffled, sizes),
            "drift": drift(values),
            "random_drift": drift(shuffled),
        }
    return found


def inspect_json(capsys, *args: str) -> dict:
    assert main(["inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "options",
    [
        {},  # the defaults: pieces of 64 records, one lane per shard
        {"num_lanes": 4, "piece_records": 0},  # four whole shards at a time: it drifts
    ],
)
def test_label_diversity_and_drift_equal_the_loaders(capsys, sorted_set, options):
    pattern, keys = sorted_set
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]
    report = inspect_json(
        capsys, pattern, "--label=cls", "--batch-size=32", "--num-workers=2", *flags
    )
    settings = {
        **options,
        "piece_records": options.get("piece_records", DEFAULT_PIECE_RECORDS) or None,
    }
    expected = loader_order(pattern, keys, batch_size=32, num_workers=2, **settings)
    assert report["settings"]["label"] == "cls"
    for name in ("sources", "label"):
        order, wanted = report["order"][name], expected[name]
        assert order["field"] == ("__source__" if name == "sources" else "cls")
        for figure, value in wanted.items():
            assert order[figure] == pytest.approx(value, rel=1e-9), (name, figure)
        assert order["diversity"] == pytest.approx(
            wanted["mean_distinct"] / wanted["random_mean_distinct"]
        )
        assert order["drift_ratio"] == pytest.approx(wanted["drift"] / wanted["random_drift"])
        assert sum(order["histogram"].values()) == sum(keys.values())
        assert len(order["tenth_histograms"]) == 10
    assert set(report["order"]["label"]["histogram"]) == {str(c) for c in range(SHARDS // 2)}
    if options:
        assert report["order"]["label"]["drift_ratio"] > 1.5
        advice = report["advice"]
        assert advice["drifting"] and "piece_records" in " ".join(advice["messages"])
    else:
        assert report["order"]["label"]["drift_ratio"] < 1.5


def test_a_missing_label_names_the_fields_there_are(sorted_set):
    pattern, _ = sorted_set
    with pytest.raises(TransformError, match=r"no field 'klass'.*\['bin', 'cls'\]"):
        inspect_batches(pattern, label="klass", advise=False)


def test_plot_draws_the_drift(sorted_set, tmp_path):
    pytest.importorskip("matplotlib")
    pattern, _ = sorted_set
    path = tmp_path / "drift.png"
    assert main(["inspect", pattern, "--label=cls", "--no-advice", f"--plot={path}"]) == 0
    assert path.read_bytes().startswith(b"\x89PNG")
