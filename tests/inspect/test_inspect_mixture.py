"""inspect on a mixture: each dataset's counts per batch against a MixingLoader's real batches."""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.cli.main import main
from shardmix.errors import ConfigError
from shardmix.inspect import INSPECT_SCHEMA_VERSION, ideal_distinct_sources, inspect_batches

from shards import write_shards

SIZES = {
    "web": ("tar", [30, 50, 20, 45, 25]),
    "code": ("tfrecord", [40, 60, 35]),
    "books": ("tar", [8, 12]),
}


@pytest.fixture(scope="module")
def patterns(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixture")
    return {name: write_shards(root / name, fmt, sizes) for name, (fmt, sizes) in SIZES.items()}


def real_batches(patterns, weights, **settings) -> list[dict[str, Counter]]:
    """Per batch, from a MixingLoader reading the real samples: per dataset, samples per shard."""
    seed = settings.pop("seed", 0)
    datasets = {name: ShardDataset(patterns[name], seed=seed) for name in weights}
    loader = MixingLoader(datasets, weights=weights, seed=seed, collate_fn=list, **settings)
    found = []
    for batch in loader:
        per_dataset: dict[str, Counter] = {name: Counter() for name in weights}
        for sample in batch:
            per_dataset[sample["__dataset__"]][sample["__source__"]] += 1
        found.append(per_dataset)
    return found


def reported(data: dict) -> list[dict[str, Counter]]:
    return [
        {name: Counter(part["sources"]) for name, part in batch["datasets"].items()}
        for batch in data["batches"]
    ]


CASES = [
    ({"web": 0.7, "code": 0.3}, 16, 0, "first_exhausted"),
    ({"web": 0.5, "code": 0.3, "books": 0.2}, 10, 2, "all_exhausted"),
]


@pytest.mark.parametrize(("weights", "batch_size", "num_workers", "stopping"), CASES)
def test_json_counts_per_dataset_equal_the_loaders_batches(
    capsys, patterns, weights, batch_size, num_workers, stopping
):
    args = [f"--dataset={name}={weight}:{patterns[name]}" for name, weight in weights.items()]
    settings = [f"--batch-size={batch_size}", f"--num-workers={num_workers}", "--seed=3"]
    assert main(["inspect", *args, *settings, f"--stopping={stopping}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = real_batches(
        patterns,
        weights,
        batch_size=batch_size,
        num_workers=num_workers,
        seed=3,
        stopping=stopping,
    )
    assert reported(data) == expected
    assert data["schema_version"] == INSPECT_SCHEMA_VERSION == 3
    assert data["mixture"]["stopping"] == stopping
    assert data["baseline"] is None and data["advice"] is None
    full = [batch for batch in data["batches"] if batch["size"] == batch_size]
    assert len(full) >= len(data["batches"]) - 1
    for batch in data["batches"]:
        parts = batch["datasets"]
        assert batch["size"] == sum(part["size"] for part in parts.values())
        assert sum(batch["workers"]) == batch["size"]
        assert batch["sources"] == dict(
            sum((Counter(part["sources"]) for part in parts.values()), Counter())
        )
        for name, part in parts.items():
            assert part["size"] == sum(part["sources"].values()) == sum(part["workers"])
            assert part["weight"] == pytest.approx(weights[name])
            assert part["expected"] == pytest.approx(weights[name] * batch_size)
            assert part["share"] == part["size"] / batch["size"]
            shards = data["mixture"]["datasets"][name]["shards"]
            assert part["ideal_distinct_sources"] == pytest.approx(
                ideal_distinct_sources(list(shards.values()), part["size"])
            )
            if batch["size"] == batch_size:  # every full batch within one of its weight
                assert abs(part["size"] - weights[name] * batch_size) <= 1, (batch["index"], name)
    for name, stats in data["mixture"]["datasets"].items():
        assert stats["max_deviation"] <= 1
        assert stats["summary"]["samples"] == sum(c[name].total() for c in expected)
        assert stats["num_shards"] == len(SIZES[name][1])


def test_first_exhausted_reads_one_dataset_whole(patterns):
    weights = {"web": 0.7, "code": 0.3}
    report = inspect_batches(
        {name: patterns[name] for name in weights}, weights=weights, batch_size=16, seed=1
    )
    assert report.mixture is not None
    read = {name: stats.summary.samples for name, stats in report.mixture.datasets.items()}
    whole = {name: sum(SIZES[name][1]) for name in weights}
    assert any(read[name] == whole[name] for name in weights)
    assert report.summary.samples == sum(read.values())
    assert set(report.mixture.datasets) == set(weights)


def test_library_mixture_report_is_plain_json_with_fractions_exact(patterns):
    weights = {"web": 2, "books": 1}  # normalized: 2/3 and 1/3
    report = inspect_batches(
        {name: patterns[name] for name in weights}, weights=weights, batch_size=9, batches=4
    )
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert len(data["batches"]) == 4
    for batch in data["batches"]:
        assert batch["datasets"]["web"]["size"] == 6 and batch["datasets"]["books"]["size"] == 3
    assert data["mixture"]["datasets"]["web"]["weight"] == float(Fraction(2, 3))
    assert data["settings"]["num_shards"] == len(SIZES["web"][1]) + len(SIZES["books"][1])


def test_a_single_dataset_report_has_no_mixture(patterns):
    data = inspect_batches(patterns["web"], batch_size=8, batches=2, advise=False).to_dict()
    assert data["mixture"] is None
    assert all(batch["datasets"] is None for batch in data["batches"])


def test_compare_and_weights_without_a_mixture_are_refused(patterns):
    with pytest.raises(ConfigError, match="one dataset"):
        inspect_batches(patterns, compare=True)
    with pytest.raises(ConfigError, match="dict of names"):
        inspect_batches(patterns["web"], weights={"web": 1.0})


def test_text_report_shows_each_dataset_beside_its_weight(capsys, patterns):
    args = [f"--dataset=web=0.7:{patterns['web']}", f"--dataset=code=0.3:{patterns['code']}"]
    assert main(["inspect", *args, "--batch-size=16"]) == 0
    out = capsys.readouterr().out
    assert "samples/want" in out and "files/ideal" in out
    assert "per dataset (first_exhausted)" in out
    assert "11/11.2" in out  # 0.7 x 16 = 11.2: 11 or 12 web samples a batch


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("web0.7:x.tar", "is not NAME=WEIGHT:PATTERN"),
        ("web=0.7", "is not NAME=WEIGHT:PATTERN"),
        ("web=heavy:x.tar", "must be a number >= 0"),
        ("web=-1:x.tar", "must be a number >= 0"),
        ("web=nan:x.tar", "must be a number >= 0"),
        ("w b=1:x.tar", "must be letters, digits"),
        ("web=1:", "no shard pattern"),
    ],
)
def test_cli_rejects_a_bad_dataset_spec_with_a_clear_message(capsys, spec, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", "--dataset", spec])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --dataset" in err and message in err


def test_cli_parses_patterns_with_colons_and_refuses_mixed_or_repeated(capsys, patterns):
    from shardmix.cli.inspect import dataset_spec

    assert dataset_spec("web=0.7:s3://bucket/web-{0..3}.tar") == (
        "web",
        0.7,
        "s3://bucket/web-{0..3}.tar",
    )
    web = f"--dataset=web=1:{patterns['web']}"
    assert main(["inspect", patterns["code"], web]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["inspect", web, web]) == 2
    assert "more than once" in capsys.readouterr().err
    assert main(["inspect"]) == 2


def test_plot_of_a_mixture_is_written(tmp_path, patterns):
    pytest.importorskip("matplotlib")
    path = tmp_path / "mix.png"
    args = [f"--dataset=web=0.7:{patterns['web']}", f"--dataset=code=0.3:{patterns['code']}"]
    assert main(["inspect", *args, "--batch-size=16", "--plot", str(path)]) == 0
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    svg = tmp_path / "mix.svg"
    report = inspect_batches(
        {"web": patterns["web"], "code": patterns["code"]},
        weights={"web": 0.7, "code": 0.3},
        batch_size=16,
    )
    from shardmix.inspect.plot import plot_report

    plot_report(json.loads(json.dumps(report.to_dict())), svg)
    assert "cumulative weight x batch size" in svg.read_text()
