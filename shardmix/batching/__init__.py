"""Batching: what runs in the trainer's process: chunks stored as rows, lanes merged in one fixed
order, the seeded shuffle buffer, restored residents, the end of a rank's epoch, the epoch that
drives them, and collation into batches.
"""
