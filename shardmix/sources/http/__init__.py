"""HTTP(S) shards: everything that speaks HTTP, and nothing else does.

A shard is one stream (:mod:`~shardmix.sources.http.stream`) over one urllib3 pool per process
with one redirect policy (:mod:`~shardmix.sources.http.connections`). Every request after the
first asks for the version the first answer named, and every answer is checked against it
(:mod:`~shardmix.sources.http.validators`, :mod:`~shardmix.sources.http.version`), so a resume
or a retry never mixes two versions of a shard. Failures are judged in one place
(:mod:`~shardmix.sources.http.retry`); read-ahead (:mod:`~shardmix.sources.http.readahead`)
fetches a shard in bounded blocks ahead of its reader.
"""
