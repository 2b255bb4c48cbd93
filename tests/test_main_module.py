"""``python -m shardmix`` is the ``shardmix`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_python_dash_m_runs_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"v": 1}\n{"v": 2}\n')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "shardmix", "convert", str(tmp_path / "rows.jsonl")]
    done = subprocess.run(
        command + [f"{tmp_path}/o/r-%02d.tar"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "1 shards (1 written now), 2 records" in done.stdout
    version = subprocess.run(
        [sys.executable, "-m", "shardmix", "--version"], env=env, capture_output=True, text=True
    )
    assert version.stdout.strip() == "shardmix 0.1.0"
