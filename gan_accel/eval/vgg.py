"""VGG-16 fc2 features: the space of the published precision and recall (Kynkäänniemi et al. 2019, StyleGAN's
``pr50k3``, torch-fidelity's ``vgg16`` extractor), on torchvision's VGG-16 and its ImageNet weights.

Images in [-1, 1] are quantised to uint8 as for Inception, resized to 224x224 as TensorFlow 1.x resizes
(:func:`resize_like_tf1`), normalised with ImageNet's mean and std, and read at fc2 after its ReLU (4096 numbers,
float32), as those implementations read it. The weights, torchvision's ``vgg16-397923af.pth`` (about 528 MB), come
from ``weights_path``, ``$GAN_ACCEL_VGG16_WEIGHTS`` or torch hub's cache, where the first use downloads them once
(:class:`~gan_accel.eval.weights.WeightsFile`), and are read with ``weights_only=True``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from .inception import to_uint8_rgb
from .random_features import INCEPTION_NAME
from .weights import PathLike, WeightsFile, WeightsUnavailable

VGG_NAME = "vgg16-fc2"  # the feature space's name, recorded with the scores
WEIGHTS_FILE = "vgg16-397923af.pth"
WEIGHTS_ENV = "GAN_ACCEL_VGG16_WEIGHTS"
SIZE = 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, what the weights were trained on


class VGGUnavailable(WeightsUnavailable):
    """VGG-16 features cannot be computed here: the weights file is missing, bad or cannot be downloaded."""


# torchvision publishes the first 8 hex digits of the file's SHA-256 only (in its name); they are what is checked.
WEIGHTS = WeightsFile("VGG-16", WEIGHTS_FILE, f"https://download.pytorch.org/models/{WEIGHTS_FILE}", "397923af",
                      WEIGHTS_ENV, "about 528 MB", VGGUnavailable, limit=3 * 3600.0)  # 528 MB at 50 kB/s


def resize_like_tf1(x: Tensor, size: int) -> Tensor:
    """Float images (N, C, H, W) resized to ``size`` x ``size`` as TensorFlow 1.x's bilinear resize
    (``align_corners=False``): output pixel i reads input coordinate ``i * in / out`` (no half-pixel offset, no
    antialiasing), between its floor and the next pixel (the last one repeated). The published features were
    computed on images resized this way, and torch's own bilinear filter gives other numbers."""

    def axis(length: int) -> tuple[Tensor, Tensor, Tensor]:
        step = torch.tensor(length / size, dtype=torch.float32)
        coord = torch.arange(size, dtype=torch.float32, device=x.device) * step
        low = coord.long()
        return low, (low + 1).clamp_max(length - 1), coord - low.float()

    rows, row_next, dy = axis(x.shape[2])
    cols, col_next, dx = axis(x.shape[3])
    across = x[..., cols] + (x[..., col_next] - x[..., cols]) * dx  # along each row first, as TensorFlow does
    return across[:, :, rows] + (across[:, :, row_next] - across[:, :, rows]) * dy[:, None]


class VGG16Features(nn.Module):
    """Images (N, 1 or 3, H, W) in [-1, 1], any size -> VGG-16 fc2 features after ReLU (N, 4096), float32.
    ``net`` is torchvision's VGG-16; its last two classifier layers are not used. Always in eval mode."""

    size = SIZE

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.features, self.avgpool = net.features, net.avgpool
        self.fc = net.classifier[:4]  # fc1, ReLU, dropout (off in eval), fc2
        self.register_buffer("mean", torch.tensor([255 * m for m in MEAN]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor([255 * s for s in STD]).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> VGG16Features:
        return super().train(False)  # dropout must stay off: one function in every mode

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        x = to_uint8_rgb(images, "VGG-16").to(self.mean.device).float()
        x = (resize_like_tf1(x, self.size) - self.mean) / self.std
        return torch.relu(self.fc(torch.flatten(self.avgpool(self.features(x)), 1)))


def vgg16_extractor(weights_path: PathLike | None = None, device: str | torch.device = "cpu",
                    download: bool = True) -> VGG16Features:
    """VGG-16 fc2 features as a :class:`~gan_accel.eval.features.FeatureExtractor`.

    Args:
        weights_path: a local copy of :data:`WEIGHTS_FILE`; default ``$GAN_ACCEL_VGG16_WEIGHTS``, then torch hub's
            cache (``$TORCH_HOME/hub/checkpoints``).
        device: where the network runs; batches are moved there.
        download: fetch the weights into torch hub's cache when they are nowhere (about 528 MB, once).

    Raises VGGUnavailable (one line) when the weights are missing (and cannot be downloaded) or unreadable.
    """
    from torchvision.models import vgg16

    from ..errors import UnsafeFileError
    from ..storage.pickles import load_pickle

    path = WEIGHTS.resolve(weights_path, download)
    try:
        state = load_pickle(path, mmap=True)
        with torch.device("meta"):  # no random initialisation of 138M parameters that are replaced at once
            net = vgg16()
        net.load_state_dict(state, assign=True)
    except UnsafeFileError as error:
        raise VGGUnavailable(f"{error} (expected torchvision's {WEIGHTS_FILE})") from None
    except (RuntimeError, TypeError, AttributeError) as error:
        reason = " ".join(str(error).split())[:200]
        raise VGGUnavailable(f"cannot load VGG-16 weights from {path} ({type(error).__name__}: {reason}); it must be "
                             f"torchvision's {WEIGHTS_FILE}") from None
    return VGG16Features(net).to(device)


def precision_recall_features(space: str, device: Any, log: Callable[[str], Any]) -> tuple[nn.Module | None, str]:
    """The extractor and name of the space precision and recall are measured in, beside scores in ``space``:
    VGG-16 fc2 when its weights are here, or can be downloaded (with Inception's ``space``: the pretrained
    networks come together); else (None, ``space``), said in one line with the reason."""
    try:
        return vgg16_extractor(device=device, download=space == INCEPTION_NAME), VGG_NAME
    except VGGUnavailable as error:
        log(f"gan_accel: precision and recall in {space} features, not VGG-16 fc2 ({error}); they compare with "
            "runs scored the same way, not with published ones")
        return None, space
