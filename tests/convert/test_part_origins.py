"""Parts merge only when they are parts of one conversion: the same inputs and options. A part
of another input, or written with other options, is refused by name, never merged."""

from __future__ import annotations

import os

import pytest

from shardmix.cli.main import main
from shardmix.convert import ConvertOptions, Part, convert, read_manifest, write_shards
from shardmix.errors import ConfigError


def _table(path, prefix: str, rows: int = 6):
    path.write_text("".join(f'{{"__key__": "{prefix}{n}", "txt": "{n}"}}\n' for n in range(rows)))
    return str(path)


def test_parts_of_two_different_inputs_are_refused_naming_the_inputs(tmp_path, capsys):
    first, second = _table(tmp_path / "a.jsonl", "a"), _table(tmp_path / "b.jsonl", "b")
    pattern = f"{tmp_path}/out/s-%03d.tar"
    convert([first], pattern, ConvertOptions(part=Part(0, 2)))
    with pytest.raises(ConfigError, match=r"cannot merge part 1 with part 0: .*a\.jsonl.*b\.jsonl"):
        convert([second], pattern, ConvertOptions(part=Part(1, 2)))
    assert not os.path.exists(tmp_path / "out" / "s.manifest.json")
    assert main(["convert", "--merge-manifests", pattern]) != 0
    assert f"inputs ['{first}'] vs ['{second}']" in capsys.readouterr().err
    convert([first], pattern, ConvertOptions(part=Part(1, 2), overwrite=True))
    assert read_manifest(str(tmp_path / "out" / "s.manifest.json")).records == 6


def test_parts_written_with_other_options_are_refused_naming_the_option(tmp_path):
    table = _table(tmp_path / "a.jsonl", "a")
    pattern = f"{tmp_path}/out/s-%03d.tar"
    convert([table], pattern, ConvertOptions(part=Part(0, 2), max_records=2))
    with pytest.raises(ConfigError, match=r"limits \[2, None\] vs \[3, None\]"):
        convert([table], pattern, ConvertOptions(part=Part(1, 2), max_records=3))
    with pytest.raises(ConfigError, match=r"seed None vs 7"):
        convert(
            [table],
            pattern,
            ConvertOptions(part=Part(1, 2), max_records=2, shuffle=True, seed=7, overwrite=True),
        )
    summary = convert(
        [table], pattern, ConvertOptions(part=Part(1, 2), max_records=2, overwrite=True)
    )
    assert read_manifest(str(summary.merged_manifest)).records == 6


def test_streamed_parts_with_other_limits_are_refused(tmp_path):
    rows = [{"__key__": f"k{n}", "txt": str(n)} for n in range(6)]
    pattern = f"{tmp_path}/s-%03d.tar"
    write_shards(rows, pattern, part="0/2", max_records=1)
    with pytest.raises(ConfigError, match=r"limits \[1, None\] vs \[2, None\]"):
        write_shards(rows, pattern, part="1/2", max_records=2)
    assert write_shards(rows, pattern, part="1/2", max_records=1, overwrite=True).records == 3
    assert read_manifest(f"{tmp_path}/s.manifest.json").records == 6
