"""Tar shards: a streaming tar reader that groups members into samples.

A tar shard holds samples the webdataset way: members ``a/b/x.jpg`` and ``a/b/x.seg.png``
that follow each other form one record, the sample ``{"__key__": "a/b/x", "jpg": ...,
"seg.png": ...}``. This module owns reading the tar framing (ustar, GNU and pax headers) and
the grouping of members into records; :mod:`shardmix.formats.tar_writer` writes shards that
GNU tar and webdataset read back.

Why not Python's ``tarfile``: it stops without an error at a damaged header in the middle
of an archive (the shard silently looks shorter), it accepts an archive cut between two
members as complete, its errors carry no byte offsets, and it costs tens of microseconds per
member. This reader checks every header, names the URL, byte offset and member index in each
error, refuses a shard that lacks its end-of-archive blocks, and skips payloads it does not
need by seeking (or by one read when the stream cannot seek). A member whose size field is
above ``max_member_bytes`` is refused before anything is allocated.

Damage with intact framing is a field repeated, a key that reappears, a member over
``max_member_bytes``; a bad header or a cut loses the framing. A flipped byte inside a member's
data cannot be detected: tar has no data checksum.

Name conventions follow webdataset so that both group a shard identically: the key is the
member path up to the first dot of its file name (a file name that starts with a dot takes
the directory as its key, when the directory's last part has no dot), the field is the rest,
lower-cased; names without such a dot and ``__name__`` metadata members are not samples.
Members other than regular files (directories, links, devices) are skipped. Names containing
newlines may group differently from webdataset. Sparse members are refused. A record's offset
is that of its first header (a pax or long-name header included).
"""

from __future__ import annotations

from shardmix.formats.tar.names import split_member_name
from shardmix.formats.tar.reader import TarReader

__all__ = ["TarReader", "split_member_name"]
