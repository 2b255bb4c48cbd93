"""Tar shards: a streaming tar reader that groups members into samples.

Why not Python's ``tarfile``: it stops without an error at a damaged header in the middle of an
archive (the shard silently looks shorter), accepts an archive cut between two members as
complete, gives no byte offsets in its errors, and costs tens of microseconds per member. This
reader checks every header, names the URL, byte offset and member in each error, refuses a shard
without its end-of-archive blocks, and seeks past payloads it does not need. Which archives are
read and how members group into records: docs/formats.md; how: docs/design/formats.md.
"""

from __future__ import annotations

from shardmix.formats.tar.names import split_member_name
from shardmix.formats.tar.reader import TarReader

__all__ = ["TarReader", "split_member_name"]
