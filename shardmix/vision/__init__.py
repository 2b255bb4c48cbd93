"""Images decoded and cropped in the workers, at the speed of the decoder (``shardmix[vision]``).

Transforms of encoded samples (``ShardDataset(decode=False, transform=...)``); the guide, with
how they are fast and how close to Pillow: ``docs/guides/vision.md``.
"""

from shardmix.vision.transforms import CenterCrop, DecodeImage, RandomResizedCrop

__all__ = ["CenterCrop", "DecodeImage", "RandomResizedCrop"]
