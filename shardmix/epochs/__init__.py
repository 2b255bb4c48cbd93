"""Epochs: what the loader reads, one epoch at a time: its options, checked and resolved at each
epoch's start; the kinds of epoch (one dataset's, a mixture's, the canonical ranks') and the
contract they share; how many batches an epoch holds; the loader's checkpoint and its elastic
resume. Above the dataset and the batching stage, below the API that holds them.
"""
