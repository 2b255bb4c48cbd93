"""Interrupted conversions: re-running the same command completes the set, no temp files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardmix.convert.writer as writer_module
from shardmix.convert import ConvertOptions, OutputExistsError, convert, read_manifest

from convert_data import leftovers, read_with_shardmix, shards_of

REPO = Path(__file__).resolve().parents[2]


def _manifest_digests(path: str) -> list[tuple[str, str]]:
    return [(shard.name, shard.sha256) for shard in read_manifest(path).shards]


def test_failure_midway_then_rerun_completes(jsonl, tmp_path, monkeypatch):
    path, expected = jsonl
    pattern = f"{tmp_path}/out/r-%04d.tfrecord"
    options = ConvertOptions(max_records=1000)
    real = writer_module.write_shard
    calls = []

    def failing(plan, spec, cursor, *tokenizer):
        calls.append(plan.name)
        if len(calls) == 4:
            # leave a half-written temporary file behind, as a killed process would
            Path(spec.folder, writer_module.temp_name(plan.name)).write_bytes(b"half")
            raise RuntimeError("injected failure")
        return real(plan, spec, cursor, *tokenizer)

    monkeypatch.setattr(writer_module, "write_shard", failing)
    with pytest.raises(RuntimeError, match="injected"):
        convert([str(path)], pattern, options)
    monkeypatch.setattr(writer_module, "write_shard", real)
    out = tmp_path / "out"
    assert len(shards_of(out, ".tfrecord")) == 3 and any(".partial" in n for n in leftovers(out))
    summary = convert([str(path)], pattern, options)
    assert summary.shards == 10 and summary.shards_written == 7
    assert leftovers(out) == []
    assert read_with_shardmix(shards_of(out, ".tfrecord")) == expected
    clean = convert([str(path)], f"{tmp_path}/clean/r-%04d.tfrecord", options)
    assert _manifest_digests(summary.manifest) == _manifest_digests(clean.manifest)


@pytest.mark.slow
def test_sigkill_midway_then_rerun_completes(jsonl, tmp_path):
    path, expected = jsonl
    out = tmp_path / "out"
    command = [sys.executable, "-m", "shardmix.cli.main", "convert", str(path)]
    command += [f"{out}/k-%05d.tar", "--max-records", "50"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and shards_of(out, ".tar"):
            break
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = len(shards_of(out, ".tar"))
    assert 0 < written < 200, "the run was not interrupted midway"
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    assert leftovers(out) == []
    manifest = read_manifest(str(out / "k.manifest.json"))
    assert len(manifest.shards) == 200 and manifest.records == 10_000
    assert read_with_shardmix(shards_of(out, ".tar")) == expected


def test_existing_output_is_refused_unless_overwrite(jsonl, tmp_path):
    path, _ = jsonl
    convert([str(path)], f"{tmp_path}/a-%02d.tar", ConvertOptions(max_records=4000))
    again = convert([str(path)], f"{tmp_path}/a-%02d.tar", ConvertOptions(max_records=4000))
    assert again.shards == 3 and again.shards_written == 0  # same conversion: nothing to do
    with pytest.raises(OutputExistsError, match="--overwrite"):
        convert([str(path)], f"{tmp_path}/a-%02d.tar", ConvertOptions(max_records=6000))
    summary = convert(
        [str(path)], f"{tmp_path}/a-%02d.tar", ConvertOptions(max_records=6000, overwrite=True)
    )
    assert summary.shards == 2 and len(shards_of(tmp_path, ".tar")) == 2
