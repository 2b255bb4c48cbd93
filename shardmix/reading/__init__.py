"""Reading: what runs in a DataLoader worker (or in the trainer's process with ``num_workers=0``):
open shards read as lanes, record claims checked, transforms and decoding applied, lanes taken
in turns into chunks of columns, and the workers that do it (started, pooled, watched, sent
through shared memory). Never imports the batching stage or the API above it.
"""
