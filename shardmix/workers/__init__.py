"""Workers: the process boundary seen from the trainer, the one folder that knows torch's
DataLoader.

An epoch's workers started, stopped and named when one dies (dataloader), the persistent ones
(pool), a worker stuck at its fork forked again (forkstart), chunks through a shared-memory ring
(arena), workers that die with the trainer (lifeline), and one epoch's workers as the trainer
sees them (epoch). What runs inside a worker is :mod:`shardmix.reading`'s.
"""
