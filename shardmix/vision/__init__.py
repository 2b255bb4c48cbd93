"""Images decoded and cropped in the workers, at the speed of the decoder (``shardmix[vision]``).

``RandomResizedCrop`` for training, ``CenterCrop`` for evaluation and ``DecodeImage`` for the
whole image: transforms of encoded samples (``ShardDataset(decode=False, transform=...)``),
JPEGs decoded by libjpeg-turbo (simplejpeg) at a reduced DCT scale where the crop allows,
resized by OpenCV, other formats by Pillow (counted). Why these libraries, with figures:
:mod:`shardmix.vision.decode`. The guide: ``docs/guides/vision.md``.
"""

from shardmix.vision.transforms import CenterCrop, DecodeImage, RandomResizedCrop

__all__ = ["CenterCrop", "DecodeImage", "RandomResizedCrop"]
