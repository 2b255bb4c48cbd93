"""Fuzz the tar reader: random valid archives read on every path and against tarfile's grouping.

Each archive (:func:`tar_archives.random_archive`: members up to 256 KiB, missing fields, long
names, pax headers, links, directories) is read member by member, in runs of several buffer
sizes (seekable or not) and in record blocks; every read must give what the member-by-member
path gives and the samples Python's ``tarfile`` lists. Prints the crashes and differences:

    python tools/fuzz_tar.py --count 10000 --seed 0
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from formats.test_tar_writers import differences, has_hard_links, reading  # noqa: E402
from tar_archives import random_archive, tarfile_samples  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    crashes = differing = 0
    for number in range(args.count):
        seed = args.seed + number
        data = random_archive(random.Random(seed))
        try:
            located, _, ended = reading(io.BytesIO(data), blocks=False, report=False)
            found = differences(data, one_way=not has_hard_links(data))
            if ended is not None or [s for _, _, s in located] != tarfile_samples(data):
                found.append("tarfile's grouping")
        except Exception:  # noqa: BLE001  (a crash is what the fuzz counts)
            crashes += 1
            print(f"seed {seed}: crash\n{traceback.format_exc()}", flush=True)
            continue
        if found:
            differing += 1
            print(f"seed {seed}: differs in {', '.join(found)}", flush=True)
    print(f"{args.count} archives: {crashes} crashes, {differing} with differences")
    return 1 if crashes or differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
