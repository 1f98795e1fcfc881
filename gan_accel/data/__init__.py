"""Data for GAN training: your own images (folder, ZIP, Hugging Face dataset), a fast in-memory uint8
loader, MNIST, offline digits, toy 2-D rings.

Nothing here is imported by the engine: any ``DataLoader`` works with :class:`~gan_accel.GANTrainer`.
"""

from .digits import synthetic_digits
from .image_cache import default_cache_root
from .image_scan import ScanReport, SkippedFile
from .images import ImageData, open_image_data
from .loader import UInt8ImageDataset, collate_uint8_batch, make_dataloader, uint8_to_float
from .mnist import MNIST_FILES, DatasetInfo, DatasetUnavailableError, load_mnist_uint8, resolve_dataset
from .toy import ring_centres, ring_of_gaussians

__all__ = [
    "DatasetInfo",
    "DatasetUnavailableError",
    "ImageData",
    "MNIST_FILES",
    "ScanReport",
    "SkippedFile",
    "UInt8ImageDataset",
    "collate_uint8_batch",
    "default_cache_root",
    "load_mnist_uint8",
    "make_dataloader",
    "resolve_dataset",
    "open_image_data",
    "ring_centres",
    "ring_of_gaussians",
    "synthetic_digits",
    "uint8_to_float",
]
