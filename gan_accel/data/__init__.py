"""Data for GAN training: your own images (folder, ZIP, Hugging Face dataset), a fast in-memory uint8
loader, MNIST, offline digits, toy 2-D rings and grids.

Nothing here is imported by the engine: any ``DataLoader`` works with :class:`~gan_accel.GANTrainer`.
"""

from .digits import TOY_MIXTURES, gaussian_mixture, grid_centres, ring_centres, synthetic_digits
from .image_cache import default_cache_root
from .image_data import ImageData, ImageScan, open_image_data, scan_images
from .image_decode import Preprocessing
from .image_scan import ScanReport, SkippedFile
from .loader import UInt8Collate, UInt8ImageDataset, make_dataloader, uint8_to_float
from .mnist import MNIST_FILES, DatasetInfo, DatasetUnavailableError, load_mnist_uint8, resolve_dataset

__all__ = [
    "DatasetInfo",
    "DatasetUnavailableError",
    "ImageData",
    "ImageScan",
    "MNIST_FILES",
    "Preprocessing",
    "ScanReport",
    "SkippedFile",
    "UInt8Collate",
    "UInt8ImageDataset",
    "default_cache_root",
    "load_mnist_uint8",
    "make_dataloader",
    "resolve_dataset",
    "open_image_data",
    "TOY_MIXTURES",
    "gaussian_mixture",
    "grid_centres",
    "ring_centres",
    "scan_images",
    "synthetic_digits",
    "uint8_to_float",
]
