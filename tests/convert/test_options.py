"""Options, sizes, parts and output patterns are checked when they are built."""

from __future__ import annotations

import pytest

from shardmix.convert import ConvertOptions, OutputPattern, Part, parse_size
from shardmix.errors import ConfigError
from shardmix.formats import Format


def test_sizes():
    assert parse_size("1GB") == 10**9 and parse_size("512MiB") == 512 << 20
    assert parse_size("4096") == 4096 and parse_size("2 kib") == 2048
    for bad in ("", "1XB", "-1", "0"):
        with pytest.raises(ConfigError):
            parse_size(bad)


def test_parts():
    assert Part.parse("3/4") == Part(3, 4) and Part(3, 4).tag == "p0003"
    assert Part(12345, 20000).tag == "p12345"
    for bad in ("4/4", "1", "a/b", "-1/2"):
        with pytest.raises(ConfigError):
            Part.parse(bad)


def test_patterns():
    pattern = OutputPattern.parse("out/train-%06d.tfrecord.gz")
    assert pattern.shard_name(3, Part()) == "train-000003.tfrecord.gz"
    assert pattern.shard_name(3, Part(1, 2)) == "train-p0001-000003.tfrecord.gz"
    assert pattern.format() is Format.TFRECORD and pattern.gzipped()
    assert pattern.manifest_name(Part(1, 2)) == "train-p0001.manifest.json"
    assert pattern.shard_regex(Part()).fullmatch("train-0000012.tfrecord.gz")
    for bad in ("out/train.tar", "out/%d/x-%d.tar", "x-%d-%d.tar", "x-%s.tar"):
        with pytest.raises(ConfigError):
            OutputPattern.parse(bad)
    with pytest.raises(ConfigError, match="--format"):
        OutputPattern.parse("x-%d.bin").format()


def test_options_are_validated():
    with pytest.raises(ConfigError):
        ConvertOptions(max_records=0)
    with pytest.raises(ConfigError):
        ConvertOptions(workers=0)
    assert ConvertOptions(format="tar").format is Format.TAR  # type: ignore[arg-type]
    assert ConvertOptions().limits() == (None, 1 << 30)
