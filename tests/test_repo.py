"""The repository's promises: the quick start, the sample shards, the CLI entry point."""

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    demo, tests = quick_start_commands()
    assert "tools/demo.py" in demo and "torch==2.13.0" in demo
    assert "pytest" in tests and "torch==2.13.0" in tests
    assert tests in (ROOT / ".ci/run").read_text()


def test_sample_shards_are_regenerated_byte_for_byte(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "tools/make_sample_shards.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    committed = sorted(
        p.relative_to(ROOT / "sample_shards") for p in (ROOT / "sample_shards").rglob("*.*")
    )
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.*"))
    assert committed == fresh and len(fresh) == 24
    for name in fresh:
        assert (tmp_path / name).read_bytes() == (ROOT / "sample_shards" / name).read_bytes(), name
    total = sum((ROOT / "sample_shards" / name).stat().st_size for name in fresh)
    assert total < 2 * 1024 * 1024


def test_demo_runs_on_the_sample_shards():
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/demo.py")], check=True, capture_output=True, text=True
    ).stdout
    means = [float(m) for m in re.findall(r"mean ([\d.]+) distinct files per batch", out)]
    plain, mixed = means
    assert plain < 2 < 6 < mixed


def test_test_modules_have_unique_names() -> None:
    # tests/ has no __init__.py: pytest imports each test module by its base name, so two
    # modules of one name in different folders stop the whole run at collection
    names = Counter(
        path.name for path in (ROOT / "tests").rglob("*.py") if path.name != "conftest.py"
    )
    assert [name for name, count in names.items() if count > 1] == []
