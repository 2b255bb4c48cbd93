"""The shard identities a worker sends with its chunks: each shard's once per epoch, however
many pieces it is read as, and again when the shard changed."""

from __future__ import annotations

import os

from shardmix import ShardDataset
from shardmix.plan.sharding import Piece

from shards import write_shards


def test_a_shard_read_as_pieces_is_sent_once_per_epoch_and_again_when_it_changed(tmp_path):
    pattern = write_shards(tmp_path, "tar", [96, 64])
    reads = ShardDataset(pattern, record_counts=[96, 64]).reads
    sent = []
    for piece in (Piece(0, 0, 32), Piece(0, 32, 64), Piece(1, 0, 32), Piece(0, 64, None)):
        list(reads.read_piece_blocks(piece, piece.start))
        sent.append(sorted(reads.take_opened()))
    assert sent == [[0], [], [1], []]
    first = reads.sent[0]

    path = tmp_path / "part-0000.tar"
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    list(reads.read_piece_blocks(Piece(0, 0, 32), 0))
    changed = reads.take_opened()
    assert list(changed) == [0] and changed[0] != first

    reads.sent = {}  # a new epoch (reading.lanechunks.lane_chunks)
    list(reads.read_piece_blocks(Piece(1, 32, None), 32))
    assert list(reads.take_opened()) == [1]
