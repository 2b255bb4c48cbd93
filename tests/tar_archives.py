"""Tar shards as the tools users have write them, for the tar reader's tests and fuzz.

:func:`write_as` writes samples through webdataset's ``TarWriter``, Python's ``tarfile`` (PAX,
GNU, USTAR formats), GNU tar (``--format=posix`` and ``--format=gnu``) or shardmix's own writer;
:func:`random_archive` builds a random valid archive (long names, pax headers, links,
directories, missing fields, members up to 256 KiB) and :func:`tarfile_samples` groups an
archive as Python's ``tarfile`` lists it, under the webdataset naming rule.
"""

from __future__ import annotations

import io
import random
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from shardmix.formats.tar import split_member_name
from shardmix.formats.tar_writer import TarWriter

WRITERS = ["shardmix", "webdataset", "tarfile-pax", "tarfile-gnu", "tarfile-ustar"]
GNU_WRITERS = ["gnu-posix", "gnu-gnu"]
_TARFILE_FORMATS = {
    "tarfile-pax": tarfile.PAX_FORMAT,
    "tarfile-gnu": tarfile.GNU_FORMAT,
    "tarfile-ustar": tarfile.USTAR_FORMAT,
}


def write_as(writer: str, samples: list[dict[str, Any]]) -> bytes:
    """The tar archive of ``samples`` (``{"__key__": key, field: bytes}``) ``writer`` writes."""
    if writer == "shardmix":
        out = io.BytesIO()
        with TarWriter(out) as ours:
            for sample in samples:
                ours.write(sample)
        return out.getvalue()
    if writer == "webdataset":
        import webdataset

        out = io.BytesIO()
        theirs = webdataset.TarWriter(out)
        for sample in samples:
            theirs.write(sample)
        theirs.close()
        return out.getvalue()
    if writer in _TARFILE_FORMATS:
        return _tarfile_archive(samples, _TARFILE_FORMATS[writer])
    if writer in GNU_WRITERS:
        return _gnu_tar_archive(samples, writer.removeprefix("gnu-"))
    raise ValueError(f"unknown writer {writer!r}")


def _members(samples: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [
        (f"{sample['__key__']}.{field}", value)
        for sample in samples
        for field, value in sample.items()
        if field != "__key__"
    ]


def _tarfile_archive(samples: list[dict[str, Any]], tar_format: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tar_format) as archive:
        for number, (name, value) in enumerate(_members(samples)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(value), 1_700_000_000 + number
            archive.addfile(info, io.BytesIO(value))
    return out.getvalue()


def _gnu_tar_archive(samples: list[dict[str, Any]], tar_format: str) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder, "in")
        for name, value in _members(samples):
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)
        out = Path(folder, "out.tar")
        tar = shutil.which("tar") or "tar"
        subprocess.run(
            [tar, "--sort=name", f"--format={tar_format}", "-cf", str(out), "-C", str(root)]
            + sorted(path.name for path in root.iterdir()),
            check=True,
        )
        return out.read_bytes()


def tarfile_samples(data: bytes) -> list[dict[str, Any]]:
    """The samples of ``data`` as Python's ``tarfile`` lists its members: its regular files
    and hard links (with their target's data), grouped by consecutive keys."""
    samples: list[dict[str, Any]] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for info in archive.getmembers():
            if not (info.isreg() or info.islnk()):
                continue
            parts = split_member_name(info.name)
            if parts is None:
                continue
            key, field = parts
            if not samples or samples[-1]["__key__"] != key:
                samples.append({"__key__": key})
            stream = archive.extractfile(info)
            samples[-1][field] = stream.read() if stream is not None else b""
    return samples


def random_archive(rng: random.Random) -> bytes:
    """A random valid archive whose keys never come back and whose fields never repeat: its
    records are exactly what :func:`tarfile_samples` lists."""
    tar_format = rng.choice(list(_TARFILE_FORMATS.values()))
    out = io.BytesIO()
    regular: list[str] = []
    with tarfile.open(fileobj=out, mode="w", format=tar_format) as archive:
        for record in range(rng.randint(0, 12)):
            depth = rng.choice([0, 1, 1, 4]) if tar_format != tarfile.USTAR_FORMAT else 1
            folder = "/".join(rng.choice(["d", "dir" * 12, "ü"]) for _ in range(depth))
            key = f"{folder}/r{record}" if folder else f"r{record}"
            if rng.random() < 0.2:
                _add(archive, rng, key.rsplit("/", 1)[0] + f"/sub{record}", tarfile.DIRTYPE)
            fields = rng.sample(["txt", "cls", "jpg", "seg.png", "json"], rng.randint(1, 4))
            for field in fields:
                name = f"{key}.{field}"
                if regular and rng.random() < 0.1:
                    _add(archive, rng, name, tarfile.LNKTYPE, link=rng.choice(regular))
                else:
                    _add(archive, rng, name, tarfile.REGTYPE)
                    regular.append(name)
                if rng.random() < 0.05:
                    _add(archive, rng, f"{key}.lnk{field}", tarfile.SYMTYPE, link=name)
    return out.getvalue()


def _add(
    archive: tarfile.TarFile, rng: random.Random, name: str, kind: bytes, link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.mtime = rng.choice([0, 1_700_000_000, 1_700_000_000.5])  # a float: a pax mtime
    if rng.random() < 0.2:
        info.uname, info.gname = "ü" * rng.randint(1, 40), "g"
    data = None
    if kind == tarfile.REGTYPE:
        size = rng.choice([0, 1, 100, 511, 512, 513, 5000, rng.randint(0, 256 << 10)])
        info.size = size
        data = io.BytesIO(rng.randbytes(size))
    archive.addfile(info, data)
