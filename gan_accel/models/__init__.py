"""Reference networks. Users bring their own ``nn.Module`` pairs; these know nothing of Accelerate."""

from .conditional import ConditionalDCGANGenerator, ProjectionDiscriminator
from .dcgan import DCGANDiscriminator, DCGANGenerator, dcgan_init
from .mlp import MLPDiscriminator, MLPGenerator

__all__ = ["DCGANGenerator", "DCGANDiscriminator", "dcgan_init", "ConditionalDCGANGenerator", "ProjectionDiscriminator", "MLPGenerator", "MLPDiscriminator"]
