"""A shard the manifest lists but that is gone: stat names it (glob and braces) and exits 1, a
loader over the glob warns naming it; and no CLI command answers bad input with a traceback."""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter

import pytest

from shardmix import MissingShardWarning, ShardDataset, ShardNotFoundError
from shardmix.cli.main import main
from shardmix.convert import write_shards


@pytest.fixture
def one_gone(tmp_path) -> tuple[str, str]:
    """Five converted tar shards of 40 records, with a manifest; the third deleted."""
    samples = ({"__key__": f"k{i:04d}", "txt": str(i)} for i in range(200))
    write_shards(samples, str(tmp_path / "train-%06d.tar"), max_records=40)
    gone = str(tmp_path / "train-000002.tar")
    os.remove(gone)
    return str(tmp_path), gone


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("pattern", ["train-*.tar", "train-{000000..000004}.tar"])
def test_stat_names_the_missing_shard_and_exits_1(capsys, one_gone, pattern, verify):
    folder, gone = one_gone
    code = main(["stat", f"{folder}/{pattern}", "--json", *(["--verify"] if verify else [])])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert (code, err, report["missing"]) == (1, "", [gone])
    assert report["totals"]["records"] == 160 and report["totals"]["damaged"] == 0
    assert main(["stat", f"{folder}/{pattern}", *(["--verify"] if verify else [])]) == 1
    text = capsys.readouterr().out
    assert f"1 missing shard(s), named or listed but gone:\n- {gone}" in text


def test_a_glob_that_selects_fewer_shards_reports_none_missing(capsys, one_gone):
    folder, _ = one_gone
    assert main(["stat", f"{folder}/train-00000[01].tar", "--verify"]) == 0
    assert "MISSING" not in capsys.readouterr().out


def test_a_loader_over_the_glob_warns_naming_the_missing_shard(one_gone):
    folder, gone = one_gone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = ShardDataset(f"{folder}/train-*.tar", shuffle_shards=False)
    missing = [w for w in caught if issubclass(w.category, MissingShardWarning)]
    assert len(missing) == 1 and gone in str(missing[0].message)
    assert missing[0].filename == __file__
    keys = Counter(sample["__key__"] for sample in dataset)
    assert keys == Counter(f"k{i:04d}" for i in range(200) if not 80 <= i < 120)


def test_a_loader_over_braces_refuses_the_missing_shard_by_name(one_gone):
    folder, gone = one_gone
    with pytest.raises(ShardNotFoundError, match=f"{gone}: no such shard file"):
        ShardDataset(f"{folder}/train-{{000000..000004}}.tar")


def test_a_complete_glob_does_not_warn(tmp_path):
    samples = ({"__key__": f"k{i}", "txt": "x"} for i in range(20))
    write_shards(samples, str(tmp_path / "t-%03d.tar"), max_records=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShardDataset(f"{tmp_path}/t-*.tar")


@pytest.mark.parametrize(
    "args",
    [
        ["stat", "{folder}/nothing-*.tar"],
        ["stat", "{folder}/train.manifest.json"],
        ["stat", "{folder}"],
        ["inspect", "{folder}/train-{{000000..000004}}.tar"],
        ["inspect", "{folder}/train-000000.tar", "--rank=2", "--world-size=2"],
        ["inspect", "{folder}/train-000000.tar", "--batch-size=0"],
        ["convert", "{folder}/absent.jsonl", "{folder}/out/o-%d.tar"],
        ["convert", "{folder}/train-000000.tar", "{folder}/out/o.tar"],
        ["convert", "--part", "3", "{folder}/train-000000.tar", "{folder}/out/o-%d.tar"],
        ["convert", "{folder}/train-000000.tar", "{folder}/train-%06d.tar"],
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(capsys, one_gone, args):
    folder, _ = one_gone
    argv = [arg.format(folder=folder) for arg in args]
    code = main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert (code, len(lines)) == (2, 1), lines
    assert lines[0].startswith(f"shardmix {argv[0]}: error: ")
