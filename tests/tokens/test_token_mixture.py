"""A TokenLoader mixture holds its weights in tokens: every batch's tokens of each dataset
within one ``seq_len`` of its weight, every token of the documents read yielded once, rows
independent of ``num_workers`` and of a resume, and an old state refused by its version."""

from __future__ import annotations

import pytest
from token_shards import write_token_shards

from shardmix import ShardDataset
from shardmix.errors import ConfigError
from shardmix.tokens import TokenLoader

SEQ_LEN = 64


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    # Short documents in "a", long ones in "b": a mixture by documents would skew the tokens.
    a = write_token_shards(root / "a", 8, 400, mean_log=3.0, seed=1)
    b = write_token_shards(root / "b", 4, 60, mean_log=4.5, seed=2)
    return a, b


def loader(mixture, workers: int = 0, **options) -> TokenLoader:
    (a, _), (b, _) = mixture
    datasets = {"a": ShardDataset(a, seed=3), "b": ShardDataset(b, seed=3)}
    return TokenLoader(
        datasets,
        weights={"a": 0.7, "b": 0.3},
        seq_len=SEQ_LEN,
        batch_size=8,
        window=256,
        num_workers=workers,
        **options,
    )


def shares(batch: dict) -> dict[str, int]:
    """Tokens of each dataset in ``batch``, by the shard directory its spans name."""
    found = {"a": 0, "b": 0}
    for row in batch["__segments__"]:
        for source, _, start, stop in row:
            found["a" if "/a/" in source else "b"] += stop - start
    return found


def test_every_batch_holds_the_weights_in_tokens(mixture):
    batches = list(loader(mixture))
    deviations = []
    for batch in batches:
        tokens = shares(batch)
        assert sum(tokens.values()) == int((batch["segment_ids"] > 0).sum())
        deviations.append(abs(tokens["a"] - 0.7 * sum(tokens.values())))
    assert max(deviations) <= SEQ_LEN
    (_, a), (_, b) = mixture
    # "b" (long documents, 30% of the tokens) runs out first; "a" gave about 7/3 as many.
    total = {name: sum(shares(batch)[name] for batch in batches) for name in "ab"}
    assert total["b"] == sum(len(tokens) for tokens in b.values())
    assert abs(total["a"] - 7 / 3 * total["b"]) <= SEQ_LEN


def test_every_token_read_once_with_its_ids(mixture):
    (_, a), (_, b) = mixture
    documents = {**a, **b}
    spans: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for batch in loader(mixture):
        ids = batch["input_ids"].numpy()
        for row, pieces in enumerate(batch["__segments__"]):
            at = 0
            for source, key, start, stop in pieces:
                assert (
                    ids[row, at : at + stop - start] == documents[source, key][start:stop]
                ).all()
                spans.setdefault((source, key), []).append((start, stop))
                at += stop - start
    assert set(b) <= set(spans)  # the dataset that ran out, whole
    for name, pieces in spans.items():
        pieces.sort()
        assert all(x[1] <= y[0] for x, y in zip(pieces, pieces[1:], strict=False)), name
        if name in b:  # "a" stopped within a window: some of its documents in part
            assert pieces[0][0] == 0 and pieces[-1][1] == len(b[name]), name
            assert all(x[1] == y[0] for x, y in zip(pieces, pieces[1:], strict=False)), name


def rows_of(batches: list[dict]) -> list:
    return [(batch["input_ids"].tolist(), batch["__segments__"]) for batch in batches]


def test_rows_do_not_depend_on_workers_or_a_resume(mixture):
    whole = list(loader(mixture, 1))
    assert rows_of(list(loader(mixture, 2))) == rows_of(whole)
    for stop in (1, 5, len(whole) - 1):
        first = loader(mixture, 2)
        iterator = iter(first)
        head = [next(iterator) for _ in range(stop)]
        state = first.state_dict()
        first.close()
        resumed = loader(mixture)
        resumed.load_state_dict(state)
        assert rows_of(head + list(resumed)) == rows_of(whole), stop
    again = loader(mixture)
    list(again)
    assert rows_of(list(again)) != rows_of(whole)  # the next epoch, in another order


def test_refusals(mixture):
    state = loader(mixture).state_dict()
    for version in (3, 4):
        old = {"tokens": {**state["tokens"], "version": version}}
        with pytest.raises(ConfigError, match=f"version {version}, this shardmix reads version 5"):
            loader(mixture).load_state_dict(old)
    with pytest.raises(ConfigError, match="even_ranks must be 'drop' or 'pad'"):
        loader(mixture, even_ranks="none")
    (a, _), _ = mixture
    other = TokenLoader(
        {"a": ShardDataset(a), "b": ShardDataset(a)},
        weights={"a": 0.5, "b": 0.5},
        seq_len=SEQ_LEN,
        batch_size=8,
        window=256,
    )
    with pytest.raises(ConfigError, match="weights"):
        other.load_state_dict(state)
    with pytest.raises(ConfigError, match="first_exhausted"):
        loader(mixture, stopping="all_exhausted")
    with pytest.raises(ConfigError, match="weights= weighs a dict"):
        TokenLoader(ShardDataset(a), seq_len=8, batch_size=1, weights={"a": 1.0})
