"""Write this version's golden checkpoint states (tests/golden/state/v<N>-<format>-batch7.json).

Run after a deliberate change to the state, with ``STATE_VERSION`` bumped; keep the older files
(tests/state/test_golden_state.py checks that they are refused by name).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from golden_state import golden_path, state_after_batches  # noqa: E402

from shardmix.state.codec import STATE_VERSION  # noqa: E402


def main() -> None:
    here = os.getcwd()
    for fmt in ("tar", "tfrecord"):
        with tempfile.TemporaryDirectory() as folder:
            os.chdir(folder)
            try:
                state = state_after_batches(fmt)
            finally:
                os.chdir(here)
        path = golden_path(fmt, STATE_VERSION)
        path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
