"""The shard cache (``SourceOptions(cache_dir=..., cache_limit=...)``): remote shards on disk.

Each copy is read only while it is the shard the server still has. A copy lives at one path per
URL (:mod:`~shardmix.sources.cache.store`), written under a temporary name and moved into
place. Without a limit, a JSON record beside each copy validates it; with ``cache_limit``
(:mod:`~shardmix.sources.cache.bounded`) a SQLite ledger shared by every process on the node
(:mod:`~shardmix.sources.cache.ledger`) reserves room before a byte is written, leases the
copies being read, evicts by the lanes' plans, and forgets processes that died. A copy fills as
a lane reads the remote stream (:mod:`~shardmix.sources.cache.tee`).
"""
