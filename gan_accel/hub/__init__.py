"""Share what was trained, the Hugging Face way: export a run's generator as a folder the Hub recognises, load it
back without training code, push it to the Hub.

    from gan_accel.hub import export_generator, push_to_hub
    from gan_accel import load_generator

    export_generator("runs/photos", "photos_gan")    # config.json, model.safetensors, README.md, samples.png
    G = load_generator("photos_gan")                 # or "user/photos-gan" from the Hub, a run, a checkpoint
    push_to_hub("photos_gan", "user/photos-gan")     # pip install 'gan_accel[hub]'
"""

from .export import ExportError, export_generator
from .load import load_generator, push_to_hub

__all__ = ["ExportError", "export_generator", "load_generator", "push_to_hub"]
