"""Epochs: what the loader reads, one epoch at a time: its options, the kinds of epoch and
their contract, how many batches an epoch holds, the checkpoint and its elastic resume.
"""
