"""The shard cache (``SourceOptions(cache_dir=..., cache_limit=...)``): remote shards on disk.

Unbounded: :mod:`~shardmix.sources.cache.store`; with ``cache_limit``:
:mod:`~shardmix.sources.cache.bounded`, over a ledger shared by the node's processes
(:mod:`~shardmix.sources.cache.ledger`). See docs/remote-shards.md.
"""
