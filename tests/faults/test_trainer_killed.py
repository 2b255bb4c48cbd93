"""Nothing shardmix starts outlives a trainer killed with SIGKILL: DataLoader workers, the
forkserver and its resource tracker, ``pipe:`` commands (and what they start), under fork,
spawn and forkserver.

The trainer runs in its own process over ``pipe:`` shards whose commands stall halfway
(``head -c CUT shard; sleep 300; tail -c +CUT+1 shard``), as a download may: a stalled command
writes nothing, so no broken pipe ends it when its reader dies. Once it has taken a
few batches, every process below it is listed from /proc (pid and start time); it is killed,
and ten seconds later none of them may be alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from descendants import descendants, survivors
from shards import write_shards

REPO = Path(__file__).resolve().parents[2]
LIVENESS_SECONDS = 10
LINGER = "sleep 300"
RECORDS = 2000  # per shard, of 4 KiB: a first chunk takes 1,024 from each lane
CUT = 7_000_000  # bytes before the stall: about 1,240 records

TRAINER = r"""
import sys, time
from shardmix import MixingLoader, ShardDataset, SourceOptions


def main(context, urls):
    dataset = ShardDataset(
        urls,
        source_options=SourceOptions(allow_pipe=True),
        format="tar",
        num_lanes=4,
        record_counts=[2000] * 4,  # no counting pass: it would wait for the commands' end
    )
    loader = MixingLoader(
        dataset, batch_size=4, num_workers=2, shuffle_buffer=0, multiprocessing_context=context
    )
    for step, batch in enumerate(loader):
        if step == 3:
            print("reading", flush=True)
            time.sleep(600)


if __name__ == "__main__":  # spawn and forkserver import this file in each worker
    main(sys.argv[1], sys.argv[2:])
"""


def wait_for_line(path: Path, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while "reading" not in path.read_text():
        assert process.poll() is None, f"the trainer ended early: {path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the trainer took no batch in time"
        time.sleep(0.1)


def short(commands: Iterable[str]) -> list[str]:
    return sorted(command[:60] for command in commands)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_nothing_outlives_a_killed_trainer(tmp_path: Path, context: str) -> None:
    write_shards(tmp_path / "shards", "tar", [RECORDS] * 4, payload_bytes=4 << 10)
    urls = [
        f"pipe:head -c {CUT} {path}; {LINGER}; tail -c +{CUT + 1} {path}"
        for path in sorted((tmp_path / "shards").iterdir())
    ]
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = tmp_path / "log"
    with log.open("w") as out:  # a file: orphans holding it cannot hold the test up
        trainer = subprocess.Popen(
            [sys.executable, str(script), context, *urls], stdout=out, stderr=out, env=env
        )
    try:
        wait_for_line(log, trainer, 120)
        time.sleep(1.0)  # the workers fill their pipes
        started = descendants(trainer.pid)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    commands = sorted(started.values())
    print(f"{context}: {len(started)} processes: {short(commands)}")
    # What must have been seen to be killed: both workers and every lane's command.
    assert sum(LINGER in command for command in commands) >= 4, commands
    assert len(started) >= 2 + 4, commands
    killed = time.monotonic()
    left = survivors(started, LIVENESS_SECONDS)
    print(f"all gone {time.monotonic() - killed:.2f} s after the kill" if not left else "")
    assert left == {}, f"alive {LIVENESS_SECONDS} s after the kill: {short(left.values())}"
