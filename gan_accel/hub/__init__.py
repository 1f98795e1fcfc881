"""Share what was trained, the Hugging Face way: export a run's generator as a folder the Hub recognises, load it
back without training code, push it to the Hub.

    from gan_accel.hub import export_generator, push_to_hub
    from gan_accel import load_generator

    export_generator("runs/photos", "photos_gan")    # config.json, model.safetensors, README.md, samples.png
    G = load_generator("photos_gan")                 # or "user/photos-gan" from the Hub, or a run folder
    push_to_hub("photos_gan", "user/photos-gan")     # pip install 'gan_accel[hub]'

``gan_accel.load_generator`` (this package's :func:`load_generator`) returns G alone, from an export, a
Hub repo, a run or a checkpoint; ``gan_accel.sampling.load_generator`` reads a run or a checkpoint and
returns ``(G, info)`` for ``sample_images``.
"""

from .export import ExportError, export_config, export_generator
from .load import is_export, load_export, load_generator, push_to_hub, read_export_config

__all__ = ["ExportError", "export_config", "export_generator", "is_export", "load_export", "load_generator",
           "push_to_hub", "read_export_config"]
