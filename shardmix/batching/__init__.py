"""Batching: what runs in the trainer's process for one epoch of one dataset.

Chunks stored as rows, lanes merged in one fixed order, the seeded shuffle buffer, restored
residents, the end of a rank's epoch, the epoch that drives them, and collation into batches.
"""
