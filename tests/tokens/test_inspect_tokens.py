"""``shardmix inspect --seq-len``: every figure of the token report equals the same figure
computed here, directly, over the batches of the same TokenLoader."""

from __future__ import annotations

import json
from collections import Counter
from math import comb

import pytest
from token_shards import write_token_shards

from shardmix import ShardDataset
from shardmix.cli.main import main
from shardmix.inspect import ideal_distinct_sources
from shardmix.tokens import TokenLoader

SEQ_LEN = 128


@pytest.fixture(scope="module")
def patterns(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect_tokens")
    web, web_docs = write_token_shards(root / "web", 8, 150, mean_log=4.5, seed=3)
    code, code_docs = write_token_shards(root / "code", 3, 120, fmt="tfrecord", seed=4)
    return {"web": (web, web_docs), "code": (code, code_docs)}


def direct(loader: TokenLoader, documents: dict, epoch: int, limit: int | None) -> dict:
    """The report's batches and summary, computed over the loader's own batches."""
    names = [source.name for source in loader.sources]
    weights = {s.name: float(w) for s, w in zip(loader.sources, loader.weights, strict=True)}
    dataset_of = {shard: name for name, docs in documents.items() for shard, _ in docs}
    per_shard = {name: list(Counter(s for s, _ in documents[name]).values()) for name in names}
    loader.set_epoch(epoch)
    everything = list(loader)
    batches = everything[:limit]
    figures, rows_of = [], Counter()
    for index, batch in enumerate(batches):
        segments = batch["__segments__"]
        rows = len(segments)
        pieces = sum(len(row) for row in segments)
        held = {(s, k) for row in segments for s, k, _, _ in row}
        rows_of.update(doc for row in segments for doc in {(s, k) for s, k, _, _ in row})
        tokens = dict.fromkeys(names, 0)
        for row in segments:
            for shard, _, start, stop in row:
                tokens[dataset_of[shard]] += stop - start
        total = sum(tokens.values())
        assert total + int((batch["segment_ids"] == 0).sum()) == rows * SEQ_LEN
        drawn = Counter(dataset_of[s] for s, _ in held)
        random = sum(ideal_distinct_sources(per_shard[name], drawn[name]) for name in names)
        exact = sum(  # the hypergeometric expectation, in integers
            1 - comb(sum(counts) - n, drawn[name]) / comb(sum(counts), drawn[name])
            for name, counts in per_shard.items()
            for n in counts
        )
        assert random == pytest.approx(exact, rel=1e-9)
        parts = None
        if names != [None]:
            parts = {
                name: {
                    "tokens": tokens[name],
                    "share": tokens[name] / total,
                    "deviation": (tokens[name] - weights[name] * total) / SEQ_LEN,
                }
                for name in names
            }
        padding = rows * SEQ_LEN - total
        figures.append(
            {
                "index": index,
                "rows": rows,
                "pieces": pieces,
                "documents": len(held),
                "documents_per_row": pieces / rows,
                "tokens": total,
                "padding_tokens": padding,
                "padding_share": padding / (rows * SEQ_LEN),
                "distinct_sources": len({s for s, _ in held}),
                "random_distinct_sources": random,
                "datasets": parts,
                "max_deviation": None
                if parts is None
                else max(abs(p["deviation"]) for p in parts.values()),
            }
        )
    end = limit is None or limit >= len(everything)
    padded = figures[:-1] if end else figures
    distinct = sum(f["distinct_sources"] for f in figures)
    random = sum(f["random_distinct_sources"] for f in figures)
    cut = sum(1 for count in rows_of.values() if count > 1)
    summary = {
        "batches": len(figures),
        "rows": sum(f["rows"] for f in figures),
        "epoch_end": end,
        "documents_per_row": sum(f["pieces"] for f in figures) / sum(f["rows"] for f in figures),
        "padding_tokens": sum(f["padding_tokens"] for f in padded),
        "padding_share": sum(f["padding_tokens"] for f in padded)
        / (sum(f["rows"] for f in padded) * SEQ_LEN),
        "last_batch_padding_tokens": figures[-1]["padding_tokens"] if end else None,
        "documents": len(rows_of),
        "cut_documents": cut,
        "cut_share": cut / len(rows_of),
        "mean_distinct_sources": distinct / len(figures),
        "mean_random_distinct_sources": random / len(figures),
        "distinct_ratio": distinct / random,
        "datasets": None,
        "max_deviation": None,
    }
    if names != [None]:
        total = sum(f["tokens"] for f in figures)
        summary["datasets"] = {
            name: {
                "weight": weights[name],
                "num_shards": len(per_shard[name]),
                "tokens": sum(f["datasets"][name]["tokens"] for f in figures),
                "share": sum(f["datasets"][name]["tokens"] for f in figures) / total,
                "max_deviation": max(abs(f["datasets"][name]["deviation"]) for f in figures),
            }
            for name in names
        }
        summary["max_deviation"] = max(d["max_deviation"] for d in summary["datasets"].values())
    return {"batches": figures, "summary": summary}


def inspect_json(capsys, argv: list[str]) -> dict:
    assert main(["inspect", *argv, "--seq-len", str(SEQ_LEN), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "packing, num_workers, world_size, rank, epoch, limit",
    [("best_fit", 0, 1, 0, 0, None), ("concat", 2, 1, 0, 1, 7), ("best_fit", 0, 2, 1, 0, None)],
)
def test_every_figure_equals_a_direct_computation_over_the_loaders_batches(
    capsys, patterns, packing, num_workers, world_size, rank, epoch, limit
):
    web, documents = patterns["web"]
    argv = [web, "--packing", packing, "--num-workers", str(num_workers), "--seed", "2"]
    argv += ["--world-size", str(world_size), "--rank", str(rank), "--epoch", str(epoch)]
    report = inspect_json(capsys, argv + ([] if limit is None else ["--batches", str(limit)]))
    loader = TokenLoader(
        ShardDataset(web, seed=2),
        seq_len=SEQ_LEN,
        batch_size=8,
        seed=2,
        packing=packing,
        rank=rank,
        world_size=world_size,
    )
    expected = direct(loader, {None: documents}, epoch, limit)
    assert report["batches"] == expected["batches"]
    assert report["summary"] == expected["summary"]
    assert report["loader"] == "TokenLoader" and report["schema_version"] == 1
    assert report["shards"] == dict(Counter(shard for shard, _ in documents))
    assert report["settings"]["packing"] == packing
    summary = report["summary"]
    assert summary["batches"] == (limit or summary["batches"]) and summary["batches"] > 5
    if packing == "best_fit" and limit is None:  # best fit pads only at a window's end
        assert 0 < summary["padding_share"] < 0.01
        assert summary["distinct_ratio"] > 0.85


def test_a_mixtures_token_shares_follow_its_weights(capsys, patterns):
    (web, web_docs), (code, code_docs) = patterns["web"], patterns["code"]
    argv = ["--dataset", f"web=0.7:{web}", "--dataset", f"code=0.3:{code}", "--seed", "1"]
    report = inspect_json(capsys, argv)
    loader = TokenLoader(
        {"web": ShardDataset(web, seed=1), "code": ShardDataset(code, seed=1)},
        weights={"web": 0.7, "code": 0.3},
        seq_len=SEQ_LEN,
        batch_size=8,
        seed=1,
    )
    expected = direct(loader, {"web": web_docs, "code": code_docs}, 0, None)
    assert report["batches"] == expected["batches"]
    assert report["summary"] == expected["summary"]
    shares = report["summary"]["datasets"]
    assert shares["web"]["share"] == pytest.approx(0.7, abs=0.02)
    assert shares["code"]["share"] == pytest.approx(0.3, abs=0.02)
    assert 0 < report["summary"]["max_deviation"] <= 1  # within a row of the weight


def test_text_report_shows_the_table_and_the_summary(capsys, patterns):
    web, _ = patterns["web"]
    assert main(["inspect", web, "--seq-len", str(SEQ_LEN), "--batches", "20"]) == 0
    out = capsys.readouterr().out
    assert "docs/row" in out and "(10 batches not shown)" in out
    assert "20 batches, 160 rows (the epoch goes on)" in out
    assert "documents cut across rows:" in out and "a random draw of as many documents" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seq-len", "128", "--label", "cls"], "--label counts a label field of samples"),
        (["--seq-len", "128", "--compare"], "--compare reads the samples"),
        (["--packing", "concat"], "--packing packs tokens; give --seq-len too"),
        (["--seq-len", "128", "--even-ranks", "none"], "even_ranks must be 'drop' or 'pad'"),
    ],
)
def test_options_without_a_meaning_for_tokens_are_refused(capsys, patterns, argv, message):
    assert main(["inspect", patterns["web"][0], *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_schema_page_names_every_field(capsys, patterns):
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "inspect-schema.md").read_text()
    section = page.split("# `shardmix inspect --seq-len`")[1].split("\n# ")[0]
    report = inspect_json(capsys, [patterns["web"][0], "--batches", "2"])
    fields = {*report, *report["settings"], *report["batches"][0], *report["summary"]}
    assert {field for field in fields if f"`{field}`" not in section} == set()


def test_a_mixture_whose_datasets_share_a_shard_is_refused(capsys, patterns):
    web = patterns["web"][0]
    argv = ["inspect", "--dataset", f"a=1:{web}", "--dataset", f"b=1:{web}", "--seq-len", "64"]
    assert main(argv) == 2
    assert "both hold" in capsys.readouterr().err
