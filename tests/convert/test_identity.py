"""A re-run trusts earlier shards only for the same input content; output files are never
written through a link; a full disk and a concurrent run are named errors."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
import webdataset

from shardmix.convert import BadInputError, ConvertOptions, OutputPattern, Part, convert
from shardmix.convert import writer as writer_module
from shardmix.convert.api import OutputExistsError
from shardmix.errors import InputChangedError, OutputBusyError, OutputFullError, OutputLinkError


def rows_file(path, texts):
    path.write_text(
        "".join(json.dumps({"__key__": f"r{i}", "txt": t}) + "\n" for i, t in enumerate(texts))
    )
    return str(path)


def texts_of(out):
    found = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".tar"):
            for sample in webdataset.WebDataset(str(out / name), shardshuffle=False):
                found[sample["__key__"]] = sample["txt"].decode()
    return found


def test_an_edited_jsonl_row_is_refused_then_overwritten(tmp_path):
    table = rows_file(tmp_path / "t.jsonl", ["aa", "bb", "cc"])
    out = tmp_path / "out"
    pattern = f"{out}/x-%d.tar"
    convert([table], pattern)
    assert convert([table], pattern).shards_written == 0  # unchanged: nothing to do
    rows_file(tmp_path / "t.jsonl", ["aa", "XX", "cc"])  # same rows, same size
    with pytest.raises(InputChangedError, match=r"1 difference\(s\): .*t\.jsonl changed"):
        convert([table], pattern)
    assert texts_of(out) == {"r0": "aa", "r1": "bb", "r2": "cc"}  # untouched
    summary = convert([table], pattern, ConvertOptions(overwrite=True))
    assert summary.shards_written == 1
    assert texts_of(out) == {"r0": "aa", "r1": "XX", "r2": "cc"}
    assert convert([table], pattern).shards_written == 0


def test_a_file_that_grew_in_a_folder_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("one")
    (data / "b.txt").write_text("two")
    pattern = f"{tmp_path}/out/x-%d.tar"
    convert([str(data)], pattern)
    (data / "b.txt").write_text("two, and more")
    with pytest.raises(InputChangedError, match=r"b\.txt changed") as caught:
        convert([str(data)], pattern)
    assert "a.txt" not in str(caught.value) and "--overwrite" in str(caught.value)


def test_a_dataset_with_the_same_rows_and_other_text_is_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    pattern = f"{tmp_path}/out/x-%d.tar"
    convert(datasets.Dataset.from_dict({"txt": ["a", "b"]}), pattern)
    assert convert(datasets.Dataset.from_dict({"txt": ["a", "b"]}), pattern).shards_written == 0
    with pytest.raises(InputChangedError, match="dataset input 0 changed"):
        convert(datasets.Dataset.from_dict({"txt": ["a", "c"]}), pattern)


def test_a_link_planted_at_the_journal_is_refused(tmp_path):
    table = rows_file(tmp_path / "t.jsonl", ["aa"])
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "precious"
    target.write_text("keep")
    (out / ".x.manifest.json.journal").symlink_to(target)
    with pytest.raises(OutputLinkError, match=r"\.x\.manifest\.json\.journal: is a symbolic link"):
        convert([table], f"{out}/x-%d.tar")
    assert target.read_text() == "keep"
    (out / ".x.manifest.json.journal").unlink()
    (out / "x.manifest.json").symlink_to(target)
    with pytest.raises(OutputLinkError, match=r"x\.manifest\.json: is a symbolic link"):
        convert([table], f"{out}/x-%d.tar", ConvertOptions(overwrite=False))
    assert target.read_text() == "keep"


def test_a_full_disk_is_named_and_leaves_no_partial(tmp_path, monkeypatch):
    table = rows_file(tmp_path / "t.jsonl", ["aa", "bb"])
    out = tmp_path / "out"

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer_module._HashingFile, "write", full)
    with pytest.raises(OutputFullError, match=r"x-0\.tar: the disk is full"):
        convert([table], f"{out}/x-%d.tar")
    assert sorted(os.listdir(out)) == [".x.manifest.json.inputs", ".x.manifest.json.journal"]
    monkeypatch.undo()
    assert convert([table], f"{out}/x-%d.tar").records == 2  # the re-run completes


HOLD = """
import sys, time
from shardmix.convert.outfiles import OutputLock
lock = OutputLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_one_convert_at_a_time_per_prefix_and_part(tmp_path):
    table = rows_file(tmp_path / "t.jsonl", ["aa", "bb"])
    out = tmp_path / "out"
    out.mkdir()
    pattern = f"{out}/x-%d.tar"
    first, second = Part.parse("0/2"), Part.parse("1/2")
    manifest = out / OutputPattern.parse(pattern).manifest_name(first)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(manifest)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(OutputBusyError, match=rf"another convert \(pid {holder.pid}\)"):
            convert([table], pattern, ConvertOptions(part=first))
        # the other part has its own lock: it runs beside the first
        assert convert([table], pattern, ConvertOptions(part=second)).records == 1
    finally:
        holder.kill()
        holder.wait()
    summary = convert([table], pattern, ConvertOptions(part=first))  # the kill released it
    assert summary.records == 1 and summary.merged_manifest == str(out / "x.manifest.json")
    assert texts_of(out) == {"r0": "aa", "r1": "bb"}
    assert not any(name.endswith(".lock") for name in os.listdir(out))


def test_stat_verify_never_calls_stale_shards_verified(tmp_path, capsys):
    from shardmix.cli.main import main
    from shardmix.inspect.stat import stat_shards

    table = rows_file(tmp_path / "t.jsonl", ["aa", "bb"])
    out = tmp_path / "out"
    convert([table], f"{out}/x-%d.tar")
    shard = str(out / "x-0.tar")
    assert [s.checksum.value for s in stat_shards(shard, verify=True).shards] == ["verified"]
    rows_file(tmp_path / "t.jsonl", ["aa", "bbb"])
    (found,) = stat_shards(shard, verify=True).shards
    assert found.checksum.value == "stale"
    assert found.error == (
        f"{shard}: the sha256 matches {out}/x.manifest.json, but the input it was converted "
        f"from changed since ({table} changed); run convert again with --overwrite"
    )
    loose = tmp_path / "loose"
    loose.mkdir()
    os.link(shard, loose / "y.tar")
    main(["stat", "--verify", str(loose / "y.tar")])
    assert "ok, unverified (no manifest)" in capsys.readouterr().out


def test_fields_starting_with_two_underscores_are_reserved(tmp_path):
    table = tmp_path / "t.jsonl"
    rows = [{"__key__": "a", "txt": "ok"}, {"__key__": "b", "txt": "x", "__url__": "fake"}]
    table.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(BadInputError, match=r"t\.jsonl: row 1: field '__url__' starts with '__'"):
        convert([str(table)], f"{tmp_path}/o/x-%d.tar")
    summary = convert([str(table)], f"{tmp_path}/o/x-%d.tar", ConvertOptions(skip_bad=True))
    assert summary.records == 1 and len(summary.skipped) == 1
    assert texts_of(tmp_path / "o") == {"a": "ok"}
    data = tmp_path / "data"
    data.mkdir()
    (data / "k1.txt").write_text("one")
    (data / "k1.__key__").write_text("evil")
    with pytest.raises(BadInputError, match=r"k1\.__key__: field '__key__' starts with '__'"):
        convert([str(data)], f"{tmp_path}/p/x-%d.tar")


def test_inputs_left_out_are_counted_by_reason(tmp_path, capsys):
    from shardmix.cli.main import main

    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("a")
    (data / "README").write_text("no extension")
    (data / "Makefile").write_text("no extension")
    (data / ".hidden.txt").write_text("hidden")
    summary = convert([str(data)], f"{tmp_path}/o/x-%d.tar")
    assert summary.records == 1 and summary.skipped == ()
    assert summary.left_out == {"no extension": 2, "hidden name": 1}
    assert main(["convert", str(data), f"{tmp_path}/p/x-%d.tar"]) == 0
    assert "left out by rule: 1 hidden name, 2 no extension" in capsys.readouterr().out


@pytest.mark.parametrize(
    "planted",
    [
        ".x-0.tar.partial",  # a shard's temporary file
        "x-0.tar",  # a shard
        "x-0.tar.idx",  # a shard's index, were one written
        ".x.manifest.json.inputs",  # the input record
        ".x.manifest.json.lock",  # the lock
        ".x.manifest.json.journal",  # the journal
        "x.manifest.json",  # the manifest
    ],
)
def test_no_file_convert_writes_goes_through_a_planted_link(tmp_path, planted):
    table = rows_file(tmp_path / "t.jsonl", ["aa", "bb"])
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "precious"
    target.write_text("keep")
    (out / planted).symlink_to(target)
    for overwrite in (False, True):  # a name taken for earlier output is replaced by --overwrite
        try:
            convert([table], f"{out}/x-%d.tar", ConvertOptions(overwrite=overwrite))
        except OutputLinkError as error:
            assert str(error).startswith(f"{out / planted}: is a symbolic link")
        except OutputExistsError:
            assert not overwrite and planted in ("x-0.tar", "x-0.tar.idx")
            continue
        else:  # a leftover name is removed or replaced as a link, never written through
            assert texts_of(out) == {"r0": "aa", "r1": "bb"}
        assert target.read_text() == "keep"
        break
    assert target.read_text() == "keep"
