"""HTTP(S) shards: everything that speaks HTTP, and nothing else does.

A shard is one stream (:mod:`~shardmix.sources.http.stream`) or blocks read ahead
(:mod:`~shardmix.sources.http.readahead`), every answer held to one version of the shard
(:mod:`~shardmix.sources.http.version`). See docs/remote-shards.md.
"""
