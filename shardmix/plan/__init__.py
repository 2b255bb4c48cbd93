"""Plan: which records each rank and worker reads, before a byte of them is read.

URL patterns, the split over ranks and workers, record counts (manifests, the count cache,
re-counts, learned kept counts) and the room a bounded cache needs. Pure functions and values;
no torch (the rank exchange comes in as a function).
"""
