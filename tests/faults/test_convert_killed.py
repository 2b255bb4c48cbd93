"""``shardmix convert --workers 2`` killed with SIGKILL leaves no writer process behind.

The convert runs over a table of 200,000 rows written as 2,000 shards, so that its writers are
busy when it dies; once both are listed from /proc (pid and start time) it is killed, and ten
seconds later neither may be alive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from descendants import descendants, survivors

REPO = Path(__file__).resolve().parents[2]
LIVENESS_SECONDS = 10


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_writer_outlives_a_killed_convert(tmp_path: Path) -> None:
    table = tmp_path / "rows.jsonl"
    with table.open("w") as out:
        for row in range(200_000):
            out.write(json.dumps({"__key__": f"r{row:06d}", "txt": f"row {row}"}) + "\n")
    command = [sys.executable, "-m", "shardmix", "convert", "--workers", "2"]
    command += ["--max-records", "100", str(table), str(tmp_path / "out" / "part-%06d.tar")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = tmp_path / "log"
    with log.open("w") as out:
        convert = subprocess.Popen(command, stdout=out, stderr=out, env=env)
    try:
        deadline = time.monotonic() + 120
        started = descendants(convert.pid)
        while len(started) < 2:
            assert convert.poll() is None, f"convert ended first: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "convert started no writers in time"
            time.sleep(0.05)
            started = descendants(convert.pid)
    finally:
        convert.send_signal(signal.SIGKILL)
        convert.wait()
    print(f"{len(started)} processes: {sorted(started.values())}")
    assert len(started) == 2, started
    killed = time.monotonic()
    left = survivors(started, LIVENESS_SECONDS)
    print(f"all gone {time.monotonic() - killed:.2f} s after the kill" if not left else "")
    assert left == {}, f"alive {LIVENESS_SECONDS} s after the kill: {sorted(left.values())}"
