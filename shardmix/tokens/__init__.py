"""Token streams for language-model pretraining: documents packed into rows of ``seq_len``."""

from shardmix.tokens.batch import cu_seqlens
from shardmix.tokens.loader import TokenLoader
from shardmix.tokens.packing import Packing

__all__ = ["Packing", "TokenLoader", "cu_seqlens"]
