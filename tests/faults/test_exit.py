"""Exit: a script that never calls ``loader.close()`` ends without a word on stderr.

The README's training loop is taken from the page as written and run as a script, with its
2 workers and no ``close()``, in a fresh interpreter over 64 real image shards.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOP = re.compile(r"^## Training loop\n.*?^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_loop() -> str:
    found = LOOP.search((ROOT / "README.md").read_text())
    assert found is not None, "README.md has no Training loop block"
    code = found.group(1)
    assert "num_workers=2" in code and "close()" not in code
    return code


def jpeg(seed: int) -> bytes:
    from PIL import Image

    pixels = bytes((seed * 7 + i) % 256 for i in range(32 * 32 * 3))
    out = io.BytesIO()
    Image.frombytes("RGB", (32, 32), pixels).save(out, format="JPEG", quality=60)
    return out.getvalue()


@pytest.mark.slow
def test_readme_loop_without_close_exits_with_empty_stderr(tmp_path: Path) -> None:
    from shardmix import write_shards

    write_shards(
        ({"__key__": f"{n:06d}", "jpg": jpeg(n), "cls": str(n % 10)} for n in range(128)),
        str(tmp_path / "data" / "train-%06d.tar"),
        max_records=2,
    )
    assert len(list((tmp_path / "data").glob("train-*.tar"))) == 64
    script = readme_loop() + '\nprint("done", epoch, len(keys))\n'
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout == "done 2 64\n"


LEFT_MID_EPOCH = r"""
import sys
import shardmix.workers.pool as pool_module  # held by __main__: torn down in another order
from shardmix import MixingLoader, ShardDataset

loader = MixingLoader(ShardDataset(sys.argv[1]), batch_size=8, num_workers=2)
batches = iter(loader)
first = next(batches)
if sys.argv[2] == "close":
    loader.close()
print(len(first["__key__"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("close", ["close", "no-close"])
def test_a_script_that_leaves_an_epoch_midway_exits_with_empty_stderr(
    tmp_path: Path, close: str
) -> None:
    from shards import write_shards

    pattern = write_shards(tmp_path / "shards", "tar", [30, 12, 25, 9])
    # A pool collected after its module's globals were cleared printed "Exception ignored in
    # WorkerPool.__del__" on stderr.
    assert quiet_run(tmp_path, "-c", LEFT_MID_EPOCH, pattern, close) == "8\n"


def quiet_run(cwd: Path, *arguments: str) -> str:
    """The standard output of ``python *arguments`` (this tree's shardmix), which must end
    with status 0 and print nothing on stderr."""
    done = subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


LEFT_MID_SHARD = r"""
import sys
from shardmix import ShardDataset
from shardmix.sources import SourceOptions

urls = sys.argv[1:]
options = SourceOptions(allow_pipe=True)
samples = iter(ShardDataset(urls, seed=0, format="tar", source_options=options))
print(next(samples)["__key__"], next(samples)["__key__"])
"""


@pytest.mark.parametrize("source", ["file", "pipe"])
def test_a_script_that_leaves_a_shard_midway_exits_quietly(tmp_path: Path, source: str) -> None:
    """A dataset iterated in the script's own process, left after two samples: the exit
    prints nothing, warnings on. An open shard's clean-up ran as the modules were torn down
    ("Exception ignored"), and a ``pipe:`` command's watcher process and its pipe were left
    open (two ``ResourceWarning``)."""
    from shards import record_key, write_shards

    sizes = [30, 12]
    pattern = write_shards(tmp_path / "shards", "tar", sizes)
    written = {
        record_key(shard, record) for shard, size in enumerate(sizes) for record in range(size)
    }
    paths = sorted(str(path) for path in (tmp_path / "shards").glob("*.tar"))
    assert len(paths) == 2, pattern
    urls = paths if source == "file" else [f"pipe:cat {path}" for path in paths]
    first, second = quiet_run(tmp_path, "-W", "default", "-c", LEFT_MID_SHARD, *urls).split()
    assert first != second and {first, second} <= written


FORKED_MID_SHARD = r"""
import os
import sys
from shardmix import ShardDataset
from shardmix.sources import SourceOptions

options = SourceOptions(allow_pipe=True)
samples = iter(ShardDataset(sys.argv[1:], seed=0, format="tar", source_options=options))
keys = [next(samples)["__key__"]]
child = os.fork()
if child == 0:
    sys.exit(0)  # the child's exit runs the exit hooks it inherited
os.waitpid(child, 0)
keys += [sample["__key__"] for sample in samples]
print(len(keys), len(set(keys)))
"""


def test_a_forked_child_that_exits_leaves_its_parents_shards_to_it(tmp_path: Path) -> None:
    """A child forked mid-shard that exits the normal way closes its copies of the open lanes
    and prints nothing; its parent's ``pipe:`` commands, still running, are not its children
    and are left alone, and the parent reads every record once."""
    from shards import write_shards

    sizes = [30, 12]
    write_shards(tmp_path / "shards", "tar", sizes)
    paths = sorted(str(path) for path in (tmp_path / "shards").glob("*.tar"))
    urls = [f"pipe:cat {path}; sleep 0.5" for path in paths]
    assert quiet_run(tmp_path, "-c", FORKED_MID_SHARD, *urls) == f"{sum(sizes)} {sum(sizes)}\n"
