"""Nothing a shard says is run: members are never unpickled, URLs never run commands by default."""

from __future__ import annotations

import ast
import io
import os
import pickle
import shlex
from pathlib import Path

import pytest
import torch

from shardmix.dataset import ShardDataset
from shardmix.errors import ShardmixError, UnsupportedURLError
from shardmix.formats.tar_writer import TarWriter
from shardmix.loader import MixingLoader
from shardmix.sources import open_shard

PACKAGE = Path(__file__).resolve().parents[2] / "shardmix"


class Booby:
    """Unpickling this creates the marker file (what a hostile .pyd/.pth member would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


@pytest.fixture
def hostile_shard(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save(Booby(marker), buffer)
    fields = {
        "pyd": pickle.dumps(Booby(marker)),
        "pickle": pickle.dumps(Booby(marker), protocol=2),
        "pth": buffer.getvalue(),
    }
    path = tmp_path / "hostile.tar"
    with TarWriter(path) as writer:
        writer.write({"__key__": "evil", **fields})
        writer.write({"__key__": "evil2", **fields})
    return path, marker, fields


def test_pickled_members_come_through_as_raw_bytes(
    hostile_shard: tuple[Path, Path, dict[str, bytes]],
) -> None:
    path, marker, fields = hostile_shard
    samples = list(ShardDataset(str(path), shuffle_shards=False))
    batches = list(MixingLoader(ShardDataset(str(path)), batch_size=2, collate_fn=list))
    for sample in samples + batches[0]:
        assert {name: sample[name] for name in fields} == fields
    assert not marker.exists()
    pickle.loads(fields["pyd"])  # the payload really is hostile: loading it runs the command
    assert marker.exists()


_FORBIDDEN_CALLS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("torch", "load"),
    ("marshal", "loads"),
    ("dill", "loads"),
    ("yaml", "load"),
}
# numpy.load unpickles object arrays unless told not to: allowed only with a literal
# allow_pickle=False (shardmix.reading.decode reads .npy fields so).
_NUMPY_LOADS = {("np", "load"), ("numpy", "load")}


def _pickle_disallowed(call: ast.Call) -> bool:
    return any(
        keyword.arg == "allow_pickle"
        and isinstance(keyword.value, ast.Constant)
        and keyword.value.value is False
        for keyword in call.keywords
    )


def test_the_package_never_calls_a_deserializer_that_runs_code() -> None:
    found = []
    for source in PACKAGE.rglob("*.py"):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            function = node.func
            if isinstance(function, ast.Name) and function.id in {"eval", "exec"}:
                found.append(f"{source}:{node.lineno}")
            if (
                isinstance(function, ast.Attribute)
                and isinstance(function.value, ast.Name)
                and (function.value.id, function.attr) in _FORBIDDEN_CALLS
            ):
                found.append(f"{source}:{node.lineno}")
            if (
                isinstance(function, ast.Attribute)
                and isinstance(function.value, ast.Name)
                and (function.value.id, function.attr) in _NUMPY_LOADS
                and not _pickle_disallowed(node)
            ):
                found.append(f"{source}:{node.lineno}")
    assert found == []


def test_pipe_urls_run_nothing_by_default(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    url = f"pipe:touch {shlex.quote(str(marker))}; cat /dev/null"
    with pytest.raises(UnsupportedURLError, match="allow_pipe"):
        list(ShardDataset(url, format="tar"))  # refused when built, or at the latest when read
    with pytest.raises(UnsupportedURLError):
        open_shard(url)
    assert not marker.exists()


@pytest.mark.parametrize("url", ["nosuchscheme://bucket/x.tar", "gopher://host/x.tar"])
def test_unknown_schemes_are_refused(url: str) -> None:
    with pytest.raises(ShardmixError) as info:
        open_shard(url)
    assert isinstance(info.value, UnsupportedURLError)
    assert url.split("://")[0] in str(info.value)
