"""Reading: what runs in a DataLoader worker (or in the trainer's process with
``num_workers=0``), and only that.

Open shards read as lanes, record claims checked, transforms and decoding applied, lanes taken
in turns into chunks of columns, each worker's progress counted. Starting, pooling and stopping
the workers is :mod:`shardmix.workers`'s. Never imports the workers, the batching stage or the
API above it.
"""
