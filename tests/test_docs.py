"""Every Python block of the README and of docs/guides/ runs, as written.

A page's blocks run in order as one script, in a fresh interpreter, in a folder holding the
shards they name (`data/`, `web/`, `code/`, `books/`), so a later block may use an earlier one's
names as a reader would. A block fenced as ``python torchrun`` is a multi-node job: it runs
under a real ``torchrun`` with 2 ranks on CPU, with the substitutions below (gloo for NCCL, no
CUDA device, moto's S3 server on 127.0.0.1 for the bucket, fewer shards and workers), each of
which must still match the page, so that an edit of the page cannot silently skip one.
"""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest

from torchrun import run_job

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)

TORCHRUN_SUBSTITUTIONS = [
    ('dist.init_process_group("nccl")', 'dist.init_process_group("gloo")'),
    ('torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n', ""),
    ("train-{000000..004095}.tar", "train-{000000..000063}.tar"),
    ('cache_dir="/local/nvme/shard-cache"', 'cache_dir=os.environ["SHARD_CACHE"]'),
    ("num_workers=8", "num_workers=1"),
    ("pin_memory=True", "pin_memory=False"),
]


def blocks(page: Path) -> list[tuple[str, str]]:
    """(fence words, code) of each Python block of ``page``."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(page.read_text())]


def jpeg(seed: int) -> bytes:
    from PIL import Image

    pixels = bytes((seed * 7 + i) % 256 for i in range(256 * 256 * 3))
    out = io.BytesIO()
    Image.frombytes("RGB", (256, 256), pixels).save(out, format="JPEG", quality=60)
    return out.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards the pages name: 64 image shards, and the three datasets of the mixture."""
    from shardmix import write_shards

    root = tmp_path_factory.mktemp("docs")
    images = [jpeg(n) for n in range(8)]
    write_shards(
        ({"__key__": f"{n:06d}", "jpg": images[n % 8], "cls": str(n % 10)} for n in range(256)),
        str(root / "data" / "train-%06d.tar"),
        max_records=4,
    )
    for name, ext, shards in [("web", "tar", 64), ("code", "tfrecord", 16), ("books", "tar", 8)]:
        write_shards(
            ({"__key__": f"{name}{n:06d}", "txt": f"{name} {n}"} for n in range(16 * shards)),
            str(root / name / f"train-%06d.{ext}"),
            max_records=16,
        )
    return root


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = run_job(command, timeout=600, env=env, cwd=cwd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "Traceback" not in done.stderr, done.stderr[-6000:]


def test_every_page_has_blocks_and_every_fence_is_known() -> None:
    for page in PAGES:
        for words, _ in blocks(page):
            assert words in ("", "torchrun"), f"{page.name}: unknown fence words {words!r}"
    assert all(blocks(page) for page in PAGES if page.name != "README.md")
    assert len(blocks(ROOT / "README.md")) >= 2


@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(words == "" for words, _ in blocks(page))],
    ids=lambda page: page.name,
)
def test_the_page_runs(page: Path, folder: Path, tmp_path: Path) -> None:
    code = "\n\n".join(code for words, code in blocks(page) if words == "")
    script = tmp_path / f"page_{page.stem}.py"  # not a module name the page imports
    script.write_text(code)
    run([sys.executable, str(script)], cwd=folder)


def torchrun_script(code: str) -> str:
    for old, new in TORCHRUN_SUBSTITUTIONS:
        assert old in code, f"the page no longer holds {old!r}: update TORCHRUN_SUBSTITUTIONS"
        code = code.replace(old, new)
    return code


@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(words == "torchrun" for words, _ in blocks(page))],
    ids=lambda page: page.name,
)
def test_the_multi_node_job_runs_under_torchrun(
    page: Path, folder: Path, tmp_path: Path, s3_server: tuple[str, object]
) -> None:
    endpoint, client = s3_server
    client.create_bucket(Bucket="my-bucket")  # type: ignore[attr-defined]
    for shard in sorted((folder / "data").glob("train-*.tar")):
        client.upload_file(str(shard), "my-bucket", shard.name)  # type: ignore[attr-defined]
    for words, code in blocks(page):
        if words != "torchrun":
            continue
        script = tmp_path / "train.py"
        script.write_text(torchrun_script(code))
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "SHARD_CACHE": str(tmp_path / "cache"),
        }
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        run([*command, "--nproc_per_node=2", str(script)], cwd=folder, env=env)
        assert len(list((tmp_path / "cache").rglob("*.tar"))) == 64
