"""Share what was trained, the Hugging Face way: every G that :func:`load_generator` returns has
``save_pretrained``, ``push_to_hub`` and ``from_pretrained`` (``huggingface_hub``'s ``PyTorchModelHubMixin``);
``export_generator`` writes a run's G as a new folder.

    from gan_accel import load_generator

    G = load_generator("runs/photos")                # a run, a checkpoint, a saved folder or "user/photos-gan"
    G.save_pretrained("photos_gan")                  # config.json, model.safetensors, README.md, samples.png
    G.push_to_hub("user/photos-gan")
    G = type(G).from_pretrained("user/photos-gan")   # what load_generator("user/photos-gan") gives
"""

from ..errors import ExportError
from .export import export_generator
from .load import push_to_hub
from .pretrained import HubGenerator, load_generator

__all__ = ["ExportError", "HubGenerator", "export_generator", "load_generator", "push_to_hub"]
