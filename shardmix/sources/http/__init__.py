"""HTTP(S) shards: everything that speaks HTTP, and nothing else does.

Design: a shard is one stream (:mod:`~shardmix.sources.http.stream`) over one urllib3 pool per
process, with one redirect policy (:mod:`~shardmix.sources.http.connections`). Every request
after the first asks for the version the first answer named, and every answer is checked against
it (:mod:`~shardmix.sources.http.validators` says what an answer names,
:mod:`~shardmix.sources.http.version` holds a stream to it), so a resume or a retry never mixes
two versions of a shard. Failures are judged and waited out in one place
(:mod:`~shardmix.sources.http.retry`); bodies are read straight into the caller's buffer
(:func:`~shardmix.sources.http.stream.read_into`). Read-ahead
(:mod:`~shardmix.sources.http.readahead`) fetches a shard in bounded blocks
(:func:`~shardmix.sources.http.readahead.fetch_block`) on the process's fetch pool, ahead of its
reader. What is not HTTP's (the scheme registry, identities, ranged reads over any remote
storage, the cache) stays in :mod:`shardmix.sources`.
"""
