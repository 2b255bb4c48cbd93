"""A ShardWriter refuses token options rather than writing raw text in their place."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardmix
from shardmix.convert import ConvertOptions, TokenOptions


def test_token_options_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    options = ConvertOptions(tokens=TokenOptions("/nonexistent/tokenizer.json"))
    with pytest.raises(shardmix.ConfigError, match=r"tokens=.*--tokenizer") as caught:
        shardmix.write_shards([{"text": "hello"}], f"{tmp_path}/x/s-%03d.tar", options)
    assert isinstance(caught.value, ValueError)
    assert "shardmix.convert.convert" in str(caught.value)
    assert not (tmp_path / "x").exists()
