"""One writer per output prefix, across processes: write_shards, ShardWriter and convert take
the prefix's lock for their whole run; the second is refused by name; a killed writer leaves
the prefix free and its shards refused until overwritten, never merged in silence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import shardmix
from shardmix.convert import ConvertOptions, OutputExistsError, Part, convert, write_shards
from shardmix.errors import OutputBusyError

# A second process: write_shards of w00000..w00099 (30 a shard) that stops after sample
# argv[2] until a line comes on stdin (or is killed there).
STREAM = """
import sys
from shardmix.convert import write_shards

def samples():
    for number in range(100):
        yield {"__key__": f"w{number:05d}", "txt": f"from {number}"}
        if number == int(sys.argv[2]):
            print("writing", flush=True)
            sys.stdin.readline()

write_shards(samples(), sys.argv[1], max_records=30)
"""


def keys_of(folder, suffix=".tar") -> list[str]:
    urls = sorted(str(folder / name) for name in os.listdir(folder) if name.endswith(suffix))
    return sorted(s["__key__"] for s in shardmix.ShardDataset(urls, shuffle_shards=False))


def start_stream(pattern: str, stop: int = 0) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-c", STREAM, pattern, str(stop)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdout.readline() == b"writing\n"
    return process


def test_two_write_shards_at_once_the_second_is_refused_and_the_first_is_exact(tmp_path):
    pattern = str(tmp_path / "s-%04d.tar")
    first = start_stream(pattern)
    try:
        mine = [{"__key__": f"m{n}", "txt": "mine"} for n in range(10)]
        with pytest.raises(OutputBusyError, match=rf"another ShardWriter \(pid {first.pid}\)"):
            write_shards(mine, pattern)
        with pytest.raises(OutputBusyError, match=rf"\(pid {first.pid}\)"):
            write_shards(mine, pattern, overwrite=True)  # overwrite does not take it either
        table = tmp_path / "rows.jsonl"
        table.write_text('{"__key__": "j0", "txt": "j"}\n')
        with pytest.raises(OutputBusyError, match=rf"\(pid {first.pid}\)"):
            convert([str(table)], pattern)
        first.communicate(b"go\n")
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0
    assert keys_of(tmp_path) == [f"w{n:05d}" for n in range(100)]
    manifest = shardmix.convert.read_manifest(str(tmp_path / "s.manifest.json"))
    assert manifest.records == 100 and len(manifest.shards) == 4
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".lock")]


def test_a_killed_writer_frees_the_prefix_and_its_shards_are_never_taken_as_a_set(tmp_path):
    pattern = str(tmp_path / "s-%04d.tar")
    first = start_stream(pattern, stop=40)  # s-0000.tar finished, s-0001.tar being written
    first.send_signal(signal.SIGKILL)
    first.wait()
    rows = [{"__key__": f"n{n}", "txt": "new"} for n in range(5)]
    with pytest.raises(OutputExistsError, match="s-0000.tar"):
        write_shards(rows, pattern)  # the dead run's shard, with no manifest
    assert write_shards(rows, pattern, overwrite=True).records == 5
    assert keys_of(tmp_path) == [f"n{n}" for n in range(5)]
    assert sorted(os.listdir(tmp_path)) == ["s-0000.tar", "s.manifest.json"]


def test_parts_share_the_prefix_and_a_whole_writer_is_refused_beside_them(tmp_path):
    table = tmp_path / "rows.jsonl"
    table.write_text("".join(f'{{"__key__": "r{n}", "txt": "{n}"}}\n' for n in range(6)))
    pattern = str(tmp_path / "out" / "s-%04d.tar")
    holder = start_stream(pattern)
    try:
        with pytest.raises(OutputBusyError, match=rf"another ShardWriter \(pid {holder.pid}\)"):
            convert([str(table)], pattern, ConvertOptions(part=Part(0, 2)))
    finally:
        holder.kill()
        holder.wait()
    for index in range(2):
        convert([str(table)], pattern, ConvertOptions(part=Part(index, 2), overwrite=True))
    assert shardmix.convert.read_manifest(str(tmp_path / "out" / "s.manifest.json")).records == 6
    assert not [name for name in os.listdir(tmp_path / "out") if name.endswith(".lock")]
