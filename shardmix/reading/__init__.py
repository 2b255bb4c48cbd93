"""Reading: what runs in a DataLoader worker (or in the trainer's process with
``num_workers=0``), and only that.

Shards read as lanes, counts checked, transforms and decoding applied, lanes taken in turns
into chunks of columns. Never imports the workers, the batching stage or the API above it.
"""
