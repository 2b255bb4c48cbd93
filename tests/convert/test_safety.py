"""Nothing is ever written outside the output folder, and links out of inputs are refused."""

from __future__ import annotations

import json
import os

import pytest

from shardmix.convert import BadInputError, ConvertOptions, convert
from shardmix.convert.inputs import check_key

from convert_data import read_with_shardmix, shards_of


@pytest.mark.parametrize("key", ["../evil", "/etc/passwd", "a/../../b", "a//b", "./x", "a\\..\\b"])
def test_unsafe_keys_are_refused(key):
    with pytest.raises(BadInputError, match="outside the output folder"):
        check_key(key, "t.jsonl")


def test_traversal_keys_in_a_table(tmp_path):
    rows = [{"__key__": "ok/1", "v": 1}, {"__key__": "../../escape", "v": 2}, {"__key__": "/abs"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BadInputError, match="escape"):
        convert([str(tmp_path / "t.jsonl")], f"{tmp_path}/o/x-%d.tar")
    summary = convert(
        [str(tmp_path / "t.jsonl")], f"{tmp_path}/o/x-%d.tar", ConvertOptions(skip_bad=True)
    )
    assert summary.records == 1 and len(summary.skipped) == 2
    assert sorted(os.listdir(tmp_path)) == ["o", "t.jsonl"]


def test_links_out_of_an_input_folder(tmp_path):
    (tmp_path / "secret.txt").write_text("do not ship")
    root = tmp_path / "data"
    root.mkdir()
    (root / "a.txt").write_text("a")
    (root / "b.txt").symlink_to(tmp_path / "secret.txt")
    (root / "c.txt").symlink_to(root / "a.txt")  # stays inside: allowed
    with pytest.raises(BadInputError, match="--follow-links"):
        convert([str(root)], f"{tmp_path}/o/x-%d.tar")
    summary = convert([str(root)], f"{tmp_path}/p/x-%d.tar", ConvertOptions(follow_links=True))
    assert summary.records == 3
    found = read_with_shardmix(shards_of(tmp_path / "p", ".tar"))
    assert {key for key, _ in found} == {"a", "b", "c"}


def test_inlined_file_outside_the_table_folder(tmp_path):
    (tmp_path / "secret").write_text("x")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "t.jsonl").write_text(json.dumps({"img": "../secret"}) + "\n")
    options = ConvertOptions(inline_columns=("img",))
    with pytest.raises(BadInputError, match="outside the table's folder"):
        convert([str(tmp_path / "t" / "t.jsonl")], f"{tmp_path}/o/x-%d.tar", options)


def test_a_planted_link_at_a_temporary_name_is_not_followed(tmp_path):
    (tmp_path / "t.jsonl").write_text(json.dumps({"v": 1}) + "\n")
    out = tmp_path / "o"
    out.mkdir()
    target = tmp_path / "victim"
    target.write_text("keep")
    (out / ".x-0.tar.partial").symlink_to(target)
    convert([str(tmp_path / "t.jsonl")], f"{out}/x-%d.tar")
    assert target.read_text() == "keep"
    assert sorted(os.listdir(out)) == [".x.manifest.json.inputs", "x-0.tar", "x.manifest.json"]
