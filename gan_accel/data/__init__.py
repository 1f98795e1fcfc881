"""Data for GAN training: a fast in-memory uint8 image loader, MNIST, offline digits, toy 2-D rings.

Nothing here is imported by the engine: any ``DataLoader`` works with :class:`~gan_accel.GANTrainer`.
"""

from .digits import synthetic_digits
from .loader import UInt8ImageDataset, collate_uint8_batch, make_dataloader, uint8_to_float
from .mnist import MNIST_FILES, DatasetInfo, DatasetUnavailableError, load_mnist_uint8, resolve_dataset
from .toy import ring_centres, ring_of_gaussians

__all__ = [
    "DatasetInfo",
    "DatasetUnavailableError",
    "MNIST_FILES",
    "UInt8ImageDataset",
    "collate_uint8_batch",
    "load_mnist_uint8",
    "make_dataloader",
    "resolve_dataset",
    "ring_centres",
    "ring_of_gaussians",
    "synthetic_digits",
    "uint8_to_float",
]
