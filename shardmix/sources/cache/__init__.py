"""The shard cache (``SourceOptions(cache_dir=..., cache_limit=...)``): remote shards on disk.

Design: each copy is read while it is the shard the server still has. A copy lives at one path
per URL (:mod:`~shardmix.sources.cache.store`), written under a temporary name and moved into
place, so a reader finds no copy or a whole one. Without a limit, a JSON record beside each copy
validates it. With ``cache_limit`` the cache is bounded
(:mod:`~shardmix.sources.cache.bounded`): a SQLite ledger in the folder, shared by every process
on the node (:mod:`~shardmix.sources.cache.ledger`), reserves room before a byte is written,
leases the copies being read, learns from the lanes' plans which copies are needed next and
evicts by them (:func:`~shardmix.sources.cache.ledger.choose_victims`), and forgets processes
that died (:func:`~shardmix.sources.cache.ledger.alive`). A copy fills as a lane reads the
remote stream (:mod:`~shardmix.sources.cache.tee`); a copy of a shard's first part only is read
on from the source (:class:`~shardmix.sources.cache.bounded.SplicedStream`). Which shards are
cached is :func:`shardmix.sources.open_shard`'s choice.
"""
