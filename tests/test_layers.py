"""The import graph runs one way: from the bytes at the bottom to the API at the top.

Every ``import`` in the package counts, those under ``if TYPE_CHECKING:`` and those inside
functions included: a type hint that reaches upwards is a cycle waiting for its first caller.
The layers are the pipeline of the README's picture. Each module sits in exactly one; it may
import its own layer and the layers below. Torch stays out of the layers that only move bytes
and plan.

The edges and cycles that break these rules today are listed by name below, so that the test
fails both when a new one appears and when a listed one is gone (then strike it from the list).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "shardmix"

# Bottom to top. A module is matched by its longest listed prefix; "" is the package itself.
# The stages' folders are layers whole: plan/ (which records), state/ (the checkpoint's format),
# reading/ (what runs in a worker), workers/ (the process boundary, seen from the trainer),
# batching/ (what runs in the trainer's process for one epoch), epochs/ (the loader's epochs).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "policy")),
    ("bytes", ("sources", "formats")),
    ("plan", ("plan",)),
    ("world", ("world", "state")),
    ("reading", ("reading", "vision")),
    ("workers", ("workers",)),
    ("batching", ("batching",)),
    ("dataset", ("dataset",)),
    ("epochs", ("epochs",)),
    (
        "api",
        (
            "loader",
            "lightning",
            "accelerate",
            "hf",
            "dcp",
            "testing",
            "tokens",
            "tokens.window",
        ),
    ),
    ("tools", ("convert", "inspect", "cli", "ray", "__main__", "")),
]

NO_TORCH = ("bytes", "plan", "base")

# Upward edges that exist today (importer, imported), to be removed by the renovation.
KNOWN_UPWARD: set[tuple[str, str]] = set()

# Imports that close a cycle today (importer, imported; a trailing ``.*`` matches every
# submodule). The graph without them has no cycle; each must still close one.
KNOWN_BACK_EDGES: set[tuple[str, str]] = set()


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `module` imports anywhere in its text, named without `shardmix.`."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["shardmix", *module.split(".")] if module else ["shardmix"]
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
        for target in targets:
            if target != "shardmix" and not target.startswith("shardmix."):
                continue
            name = target.removeprefix("shardmix").removeprefix(".")
            while name not in known and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in known and name != module:
                found.add(name)
                break
    return found


def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imported(name, path, known) for name, path in known.items()}


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (prefix != "" and module.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    for module in module_names():
        layer_of(module)


def test_imports_run_upwards_only() -> None:
    upward = {
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if layer_of(target) > layer_of(module)
    }
    assert upward - KNOWN_UPWARD == set(), "new imports reaching a higher layer"
    assert KNOWN_UPWARD - upward == set(), "gone: strike these from KNOWN_UPWARD"


def known_back_edge(module: str, target: str) -> tuple[str, str] | None:
    for importer, imported_name in KNOWN_BACK_EDGES:
        if target != imported_name:
            continue
        if importer == module or (
            importer.endswith(".*") and module.startswith(importer.removesuffix("*"))
        ):
            return importer, imported_name
    return None


def test_no_import_cycles_beyond_the_known_back_edges() -> None:
    edges = graph()
    kept = {m: {t for t in ts if known_back_edge(m, t) is None} for m, ts in edges.items()}
    assert cycles(kept) == set(), "new import cycles"
    closing = set()
    for module, targets in edges.items():
        for target in targets:
            edge = known_back_edge(module, target)
            if edge is not None and cycles({**kept, module: kept[module] | {target}}):
                closing.add(edge)
    assert KNOWN_BACK_EDGES - closing == set(), "no longer close a cycle: strike them"


def test_bytes_and_plan_layers_import_no_torch() -> None:
    heavy = {"torch"}
    offenders = []
    for module, path in module_names().items():
        if LAYERS[layer_of(module)][0] not in NO_TORCH:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            offenders += [f"{module} imports {root}" for root in roots & heavy]
    assert offenders == []


def test_the_graph_sees_type_hint_and_function_imports(tmp_path: Path) -> None:
    """The checker itself: an import under TYPE_CHECKING or inside a function is an edge."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from shardmix.loader import MixingLoader\n"
        "def late():\n"
        "    from .dataset import ShardDataset\n"
        "    import shardmix.sources.http\n"
    )
    known = module_names()
    assert imported("probe", source, known) == {"loader", "dataset", "sources.http"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
