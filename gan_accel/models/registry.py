"""Model families by name: G and D built from a JSON-only *spec* that a run records.

A spec is a flat dict of JSON values, e.g. ``{"family": "resnet", "z_dim": 128, "width": 64,
"d_width": 64, "image_size": 128, "channels": 3, "num_classes": None, "norm": "batch"}``. It is
what a run writes into its config (``config.model``) and what sampling rebuilds G from, so
:func:`normalize_spec` fills every default in: a recorded spec never depends on the defaults of the
version that reads it.

Families: ``"dcgan"`` (:mod:`~gan_accel.models.dcgan`, :mod:`~gan_accel.models.conditional`; 28, 32
and 64 px), ``"resnet"`` (:mod:`~gan_accel.models.resnet`; 28 to 256 px) and ``"r3gan"``
(:mod:`~gan_accel.models.r3gan`; 28 to 256 px). A spec without
``"family"`` is one the example scripts wrote before there were families: a DCGAN, conditional when
it says ``"conditional": true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from ..errors import ConfigError
from . import dcgan, r3gan, resnet
from .conditional import POSITIONS as CONDITIONAL_POSITIONS
from .conditional import ConditionalDCGANGenerator, ProjectionDiscriminator
from .dcgan import POSITIONS, DCGANDiscriminator, DCGANGenerator
from .resnet import ResNetDiscriminator, ResNetGenerator

COMMON = ("family", "z_dim", "width", "image_size", "channels", "num_classes")


@dataclass(frozen=True)
class Family:
    """A model family: the sizes it makes, its own spec keys with their defaults, and its builders."""

    name: str
    resolutions: tuple[int, ...]
    options: Callable[[dict[str, Any]], dict[str, Any]]  # the family's own keys, defaults for this spec
    generator: Callable[[dict[str, Any]], nn.Module]
    discriminator: Callable[[dict[str, Any]], nn.Module]
    default_z_dim: int
    default_width: Callable[[int], int]


def _dcgan_options(spec: dict[str, Any]) -> dict[str, Any]:
    conditional = spec.get("num_classes") is not None
    return {"spectral_norm": False, "d_position": "coords" if conditional else None,
            "class_stddev": True if conditional else None}


def _dcgan_G(s: dict[str, Any]) -> nn.Module:
    sizes = dict(z_dim=s["z_dim"], width=s["width"], image_size=s["image_size"], channels=s["channels"])
    if s["num_classes"] is None:
        return DCGANGenerator(**sizes)
    return ConditionalDCGANGenerator(s["num_classes"], **sizes)


def _dcgan_D(s: dict[str, Any]) -> nn.Module:
    sizes = dict(width=s["width"], image_size=s["image_size"], channels=s["channels"], spectral_norm=s["spectral_norm"])
    if s["num_classes"] is None:
        return DCGANDiscriminator(position=s["d_position"], **sizes)
    return ProjectionDiscriminator(s["num_classes"], class_stddev=s["class_stddev"], position=s["d_position"], **sizes)


def _resnet_G(s: dict[str, Any]) -> nn.Module:
    return ResNetGenerator(z_dim=s["z_dim"], width=s["width"], image_size=s["image_size"], channels=s["channels"],
                           num_classes=s["num_classes"], norm=s["norm"])


def _resnet_D(s: dict[str, Any]) -> nn.Module:
    return ResNetDiscriminator(width=s["d_width"], image_size=s["image_size"], channels=s["channels"],
                               num_classes=s["num_classes"])


def _r3gan_G(s: dict[str, Any]) -> nn.Module:
    return r3gan.R3GANGenerator(z_dim=s["z_dim"], width=s["width"], image_size=s["image_size"],
                                channels=s["channels"], num_classes=s["num_classes"], blocks=s["blocks"])


def _r3gan_D(s: dict[str, Any]) -> nn.Module:
    return r3gan.R3GANDiscriminator(width=s["d_width"], image_size=s["image_size"], channels=s["channels"],
                                    num_classes=s["num_classes"], blocks=s["blocks"])


FAMILIES: dict[str, Family] = {
    "dcgan": Family("dcgan", dcgan.SUPPORTED_SIZES, _dcgan_options, _dcgan_G, _dcgan_D, default_z_dim=100,
                    default_width=lambda size: 64),  # the paper's width
    # Width 64 (BigGAN uses 96): the 128 and 256 px models stay trainable on one GPU with a batch of 64;
    # 32 at 28 px, MNIST's size, where G already has 128 channels at 7x7.
    "resnet": Family("resnet", resnet.SUPPORTED_SIZES, lambda s: {"d_width": s["width"], "norm": "batch"},
                     _resnet_G, _resnet_D, default_z_dim=128, default_width=lambda size: 32 if size == 28 else 64),
    # R3GAN's blocks at resnet's widths per scale; not yet chosen by measurement.
    "r3gan": Family("r3gan", r3gan.SUPPORTED_SIZES, lambda s: {"d_width": s["width"], "blocks": 2}, _r3gan_G,
                    _r3gan_D, default_z_dim=64, default_width=lambda size: 32 if size == 28 else 64),
}


def supported_resolutions(family: str) -> tuple[int, ...]:
    """The image sizes (square, in pixels) a family makes."""
    return _family(family).resolutions


def default_spec(family: str, resolution: int, channels: int = 3, num_classes: int | None = None,
                 **overrides: Any) -> dict[str, Any]:
    """The complete spec of ``family`` at ``resolution`` (default width and latent size), with ``overrides``."""
    fam = _family(family)
    spec = {"family": fam.name, "z_dim": fam.default_z_dim, "width": fam.default_width(resolution),
            "image_size": resolution, "channels": channels, "num_classes": num_classes, **overrides}
    return normalize_spec(spec)


def normalize_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec checked and completed (every key of its family, defaults filled in); one-line ConfigError if not."""
    if not isinstance(spec, dict):
        raise ConfigError(f"a model spec is a dict of JSON values, got {type(spec).__name__}")
    spec = dict(spec)
    if "family" not in spec:
        raise ConfigError(f"the model spec names no family: choose one of {', '.join(FAMILIES)}")
    fam = _family(spec["family"])
    missing = [key for key in COMMON if key not in spec]
    if missing:
        raise ConfigError(f"the {fam.name} model spec lacks {', '.join(missing)}")
    full = {**{k: spec[k] for k in COMMON}, **fam.options(spec)}
    unknown = sorted(set(spec) - set(full))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)} in a {fam.name} model spec: it takes "
                          f"{', '.join(full)}")
    full.update({k: spec[k] for k in full if k in spec})
    _check_values(fam, full)
    return full


def build_generator(spec: dict[str, Any]) -> nn.Module:
    """G from a spec (see :func:`normalize_spec`); seed the global RNG first for reproducible weights."""
    spec = normalize_spec(spec)
    return FAMILIES[spec["family"]].generator(spec)


def build_discriminator(spec: dict[str, Any]) -> nn.Module:
    """D from a spec."""
    spec = normalize_spec(spec)
    return FAMILIES[spec["family"]].discriminator(spec)


def build_models(spec: dict[str, Any]) -> tuple[nn.Module, nn.Module]:
    """(G, D) from a spec; G is built first, so one seed gives the same G as :func:`build_generator`."""
    spec = normalize_spec(spec)
    fam = FAMILIES[spec["family"]]
    return fam.generator(spec), fam.discriminator(spec)


def _family(name: Any) -> Family:
    if name not in FAMILIES:
        raise ConfigError(f"unknown model family {name!r}: choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _sizes(sizes: tuple[int, ...]) -> str:
    return ", ".join(map(str, sizes[:-1])) + f" or {sizes[-1]}"


def _check_values(fam: Family, spec: dict[str, Any]) -> None:
    size = spec["image_size"]
    if size not in fam.resolutions:
        others = [f for f in FAMILIES.values() if size in f.resolutions]
        hint = f": use --model {others[0].name} for {size} px" if others else ""
        raise ConfigError(f"the {fam.name} family makes {_sizes(fam.resolutions)} px images, not {size!r}{hint}")
    for key in ("z_dim", "width", "channels") + tuple(k for k in ("d_width", "blocks") if k in spec):
        if not _positive_int(spec[key]):
            raise ConfigError(f"{key}={spec[key]!r} in the {fam.name} model spec must be an integer >= 1")
    if spec["num_classes"] is not None and not _positive_int(spec["num_classes"]):
        raise ConfigError(f"num_classes={spec['num_classes']!r} must be None (unconditional) or an integer >= 1")
    conditional = spec["num_classes"] is not None
    if "spectral_norm" in spec and not isinstance(spec["spectral_norm"], bool):
        raise ConfigError(f"spectral_norm={spec['spectral_norm']!r} must be true or false")
    if "norm" in spec and spec["norm"] not in resnet.NORMS:
        raise ConfigError(f"norm={spec['norm']!r} is not a normalisation of G: choose one of {', '.join(resnet.NORMS)}")
    positions = CONDITIONAL_POSITIONS if conditional else POSITIONS
    if spec.get("d_position") is not None and spec["d_position"] not in positions:
        raise ConfigError(f"d_position={spec['d_position']!r}: choose one of {', '.join(positions)}"
                          + (" (a conditional D)" if conditional else ""))
    if "class_stddev" in spec and conditional and not isinstance(spec["class_stddev"], bool):
        raise ConfigError(f"class_stddev={spec['class_stddev']!r} must be true or false")
    if not conditional and spec.get("class_stddev") is not None:
        raise ConfigError("class_stddev describes the conditional DCGAN's D: leave it out (or null) when "
                          "num_classes is null")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
