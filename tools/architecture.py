"""Write the module tree of docs/architecture.md from the package: each module and folder with
the first sentence of its docstring, between the page's two markers.

    python tools/architecture.py          # rewrite the tree
    python tools/architecture.py --check  # exit 1 when the page's tree is stale
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shardmix"
PAGE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- the tree below is written by tools/architecture.py -->\n"
END = "<!-- end of the written tree -->\n"
WIDTH = 100


def summary(path: Path) -> str:
    """The first sentence of the module's docstring (its first paragraph, up to a full stop)."""
    docstring = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    paragraph = " ".join(docstring.split("\n\n")[0].split())
    return re.split(r"(?<![.])\.(?: |$)", paragraph)[0]


def entries(folder: Path, depth: int) -> list[tuple[str, str]]:
    """``(indented name, summary)`` of a folder's modules, then of its subfolders, each
    followed by its own."""
    rows: list[tuple[str, str]] = []
    indent = "  " * depth
    for path in sorted(folder.glob("*.py")):
        if path.name != "__init__.py":
            rows.append((indent + path.name, summary(path)))
    for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file()):
        rows.append((f"{indent}{sub.name}/", summary(sub / "__init__.py")))
        rows += entries(sub, depth + 1)
    return rows


def tree() -> str:
    """The tree as the page shows it, in a text block."""
    rows = [("shardmix/", summary(PACKAGE / "__init__.py"))] + entries(PACKAGE, 1)
    column = max(len(name) for name, _ in rows) + 2
    lines = []
    for name, text in rows:
        wrapped = textwrap.wrap(text, WIDTH - column) or [""]
        lines.append(name.ljust(column) + wrapped[0])
        lines += [" " * column + more for more in wrapped[1:]]
    return "```text\n" + "\n".join(line.rstrip() for line in lines) + "\n```\n"


def written(page: str) -> str:
    """``page`` with the tree between its markers written afresh."""
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{PAGE} lacks the markers {BEGIN.strip()} and {END.strip()}")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + tree() + END + tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the tree is stale")
    args = parser.parse_args()
    page = PAGE.read_text()
    fresh = written(page)
    if args.check:
        if fresh != page:
            sys.exit(f"{PAGE} is stale: run python tools/architecture.py")
        return
    PAGE.write_text(fresh)


if __name__ == "__main__":
    main()
