"""Workers: the process boundary seen from the trainer, the one folder that knows torch's
DataLoader.

Starting, pooling, restarting and stopping the workers, and their chunks through shared memory;
what runs inside a worker is :mod:`shardmix.reading`'s.
"""
