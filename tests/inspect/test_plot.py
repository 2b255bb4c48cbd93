"""plot: the figure is written as a real PNG or SVG of a sensible size."""

from __future__ import annotations

import json
import struct

import pytest

from shardmix.cli.main import main
from shardmix.errors import ConfigError
from shardmix.inspect import inspect_batches
from shardmix.inspect.plot import plot_report

pytest.importorskip("matplotlib")


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_cli_writes_a_png_beside_the_json(capsys, tmp_path, shards64):
    pattern, _ = shards64
    path = tmp_path / "mix.png"
    args = ["inspect", pattern, "--batch-size=32", "--compare", "--plot", str(path), "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["baseline"] is not None
    data = path.read_bytes()
    width, height = png_size(data)
    assert 1000 <= width <= 4000 and 800 <= height <= 3000
    assert 20_000 < len(data) < 5_000_000


def test_plot_from_loaded_json_as_svg(tmp_path, shards64):
    pattern, _ = shards64
    report = json.loads(json.dumps(inspect_batches(pattern, batch_size=16).to_dict()))
    path = tmp_path / "mix.svg"
    plot_report(report, path)
    text = path.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "uniformly random ideal" in text


def test_unknown_extension_is_refused(tmp_path, shards64):
    pattern, _ = shards64
    with pytest.raises(ConfigError, match=r"\.png or \.svg"):
        plot_report(inspect_batches(pattern, batches=1), tmp_path / "mix.jpg")
