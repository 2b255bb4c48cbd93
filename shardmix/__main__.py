"""``python -m shardmix``: the same as the ``shardmix`` command."""

import sys

from shardmix.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
