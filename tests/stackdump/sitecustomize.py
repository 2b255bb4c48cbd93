"""On the PYTHONPATH of the tests' torchrun jobs (tests/torchrun.py): every Python process of a
job (the launcher, its ranks, their forked DataLoader workers) writes the stacks of all its
threads to stderr on SIGUSR1, so that a job that hangs fails with where each process waits."""

import faulthandler
import signal

faulthandler.register(signal.SIGUSR1, all_threads=True)
