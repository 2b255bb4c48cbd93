"""Images decoded and cropped in the workers, at the speed of the decoder (``shardmix[vision]``).

Transforms of encoded samples (``ShardDataset(decode=False, transform=...)``): JPEGs decoded by
libjpeg-turbo at a reduced DCT scale where the crop allows and resized by OpenCV, other formats
by Pillow (:mod:`shardmix.vision.decode`). The guide: ``docs/guides/vision.md``.
"""

from shardmix.vision.transforms import CenterCrop, DecodeImage, RandomResizedCrop

__all__ = ["CenterCrop", "DecodeImage", "RandomResizedCrop"]
