"""docs/architecture.md's module tree is the package's: written by tools/architecture.py from
each module's docstring, and stale the moment a module moves, appears or changes its summary."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import architecture  # noqa: E402


def test_the_module_tree_in_docs_architecture_is_fresh():
    page = architecture.PAGE.read_text()
    assert architecture.written(page) == page, "run python tools/architecture.py"


def test_the_tree_names_every_module_and_folder():
    tree = architecture.tree()
    for path in architecture.PACKAGE.rglob("*.py"):
        name = path.parent.name + "/" if path.name == "__init__.py" else path.name
        assert f" {name} " in tree or f"\n{name} " in tree, name
