"""Session fixtures for the convert tests: a 10,000-file class tree and a 10,000-row table."""

from __future__ import annotations

from pathlib import Path

import pytest

from convert_data import Samples, make_jsonl, make_tree


@pytest.fixture(scope="session")
def tree(tmp_path_factory) -> tuple[Path, Samples]:
    root = tmp_path_factory.mktemp("tree") / "images"
    return root, make_tree(root)


@pytest.fixture(scope="session")
def jsonl(tmp_path_factory) -> tuple[Path, Samples]:
    path = tmp_path_factory.mktemp("table") / "rows.jsonl"
    return path, make_jsonl(path)
