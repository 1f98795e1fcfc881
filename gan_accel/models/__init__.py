"""Reference networks. Users bring their own ``nn.Module`` pairs; these know nothing of Accelerate.

Families by name (a JSON spec a run records): :func:`build_models`, :func:`default_spec`.
"""

from .conditional import ConditionalDCGANGenerator, ProjectionDiscriminator
from .dcgan import DCGANDiscriminator, DCGANGenerator, dcgan_init
from .mlp import MLPDiscriminator, MLPGenerator
from .registry import (FAMILIES, build_discriminator, build_generator, build_models, default_spec, normalize_spec,
                       supported_resolutions)
from .r3gan import R3GANDiscriminator, R3GANGenerator
from .resnet import ResNetDiscriminator, ResNetGenerator

__all__ = ["DCGANGenerator", "DCGANDiscriminator", "dcgan_init", "ConditionalDCGANGenerator", "ProjectionDiscriminator",
           "MLPGenerator", "MLPDiscriminator", "ResNetGenerator", "ResNetDiscriminator",
           "R3GANGenerator", "R3GANDiscriminator",
           "FAMILIES", "build_models", "build_generator", "build_discriminator", "default_spec", "normalize_spec",
           "supported_resolutions"]
