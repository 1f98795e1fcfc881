"""The Hugging Face habits on every G that :func:`load_generator` returns: ``G.save_pretrained(folder)``,
``G.push_to_hub(repo_id)`` and ``from_pretrained(repo_or_folder)``, from ``huggingface_hub``'s
``PyTorchModelHubMixin``.

A saved folder is an export: ``config.json``, ``model.safetensors``, ``README.md`` (the card) and
``samples.png``. Loading, whatever the entry, is :func:`~gan_accel.hub.load.read_generator`'s checked path and
never the mixin's, which builds the model from ``config.json`` before anything is checked.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, PyTorchModelHubMixin
from torch import nn

from ..errors import ExportError
from ..pictures.grids import png_grid
from ..storage.layout import EXPORT_SAMPLES
from ..storage.weights import save_generator
from .card import model_card
from .load import hub_failure, read_generator, usable_device

GRID_ROWS = 16  # classes shown in a conditional G's sample grid
PER_CLASS = 8


class HubGenerator(PyTorchModelHubMixin, library_name="gan_accel"):
    """What :func:`load_generator` mixes into G's class. ``G.info`` is its ``config.json`` as a dict."""

    info: dict[str, Any]
    grid_samples, grid_seed = 64, 0  # the card's sample grid (gan-accel export's --num and --seed)

    def save_pretrained(self, save_directory: str | os.PathLike, *, model_card_kwargs: dict[str, Any] | None = None,
                        **kwargs: Any) -> str | None:
        """The mixin's ``save_pretrained``: the export's four files in ``save_directory`` (``README.md`` is kept
        when there is one). ``model_card_kwargs``: ``repo_id`` (what the card's snippet loads; default: the
        folder's name, never a path of this machine) and ``license``."""
        card = {"repo_id": Path(save_directory).name, **(model_card_kwargs or {})}
        return super().save_pretrained(save_directory, model_card_kwargs=card, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        save_generator(save_directory, self, self.info)
        grid = sample_grid(self, self.info["model"], self.grid_samples, self.grid_seed)
        (save_directory / EXPORT_SAMPLES).write_bytes(grid)

    def generate_model_card(self, repo_id: str, license: str | None = None) -> ModelCard:
        return model_card(self.info, repo_id, sum(p.numel() for p in self.parameters()), license)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """The mixin's ``push_to_hub`` (the repo made if new, one commit of the saved folder; ``private``,
        ``token``, ``commit_message``, ...), whose card loads ``repo_id``; a failure is one line."""
        kwargs["model_card_kwargs"] = {**(kwargs.get("model_card_kwargs") or {}), "repo_id": repo_id}
        try:
            return super().push_to_hub(repo_id, **kwargs)
        except Exception as error:  # no network, no write access, a bad name: all fixable by the user
            raise hub_failure(f"could not push G to the Hugging Face Hub as {repo_id}", error,
                              kwargs.get("token")) from None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *, revision: str | None = None,
                        token: str | None = None, ema: bool = True,
                        device: str | torch.device | None = None) -> nn.Module:
        """G from a Hub repo id or a folder, read as :func:`load_generator` reads it; on a G's class, a G of
        that class only."""
        G = load_generator(pretrained_model_name_or_path, ema=ema, device=device, revision=revision, token=token)
        if not isinstance(G, cls):
            raise ExportError(f"{pretrained_model_name_or_path} holds a {type(G).__name__}, not a {cls.__name__}: "
                              "load it with gan_accel.load_generator")
        return G

    def __reduce_ex__(self, protocol: Any) -> Any:
        # the class is made when G is loaded, so a pickle names G's own class and adds the methods back
        return _unpickled, (type(self).__mro__[1], self.__getstate__())


def _unpickled(cls: type[nn.Module], state: dict[str, Any]) -> nn.Module:
    G = object.__new__(_hub_class(cls))
    G.__setstate__(state)
    return G


@functools.cache
def _hub_class(cls: type[nn.Module]) -> type:
    """``cls`` with :class:`HubGenerator`'s methods, under its own name (one class per generator class)."""
    return type(cls.__name__, (cls, HubGenerator), {"__doc__": cls.__doc__})


def load_generator(source: str | os.PathLike, *, ema: bool = True, device: str | torch.device | None = None,
                   revision: str | None = None, token: str | None = None) -> nn.Module:
    """A trained G, in eval mode, from an export folder, a run folder, a checkpoint folder or a Hub repo id
    (:func:`~gan_accel.hub.load.read_generator` says which and how), with ``save_pretrained``,
    ``push_to_hub`` and ``from_pretrained``.

    ``G.info`` is the generator's ``config.json`` as a dict (``model``: the spec; ``weights``: ``step``, ``ema``,
    ``has_ema``; ``training``: the run's config; ``class_names``, ``data``, ``scores``); ``G.class_names``
    the class names of a conditional G (None otherwise); ``G.z_dim`` the latent size.
    """
    device = usable_device(device)  # before any file is read
    G = read_generator(source, ema=ema, revision=revision, token=token)
    G.__class__ = _hub_class(type(G))  # the same object, weights and state dict keys: only methods are added
    return G.to(device) if device is not None else G


@torch.no_grad()
def sample_grid(G: nn.Module, spec: dict[str, Any], num: int = 64, seed: int = 0) -> bytes:
    """A PNG grid of samples: ``num`` of them, or in a conditional G 8 per class for the first 16 classes."""
    generator, device = torch.Generator().manual_seed(seed), next(G.parameters()).device
    if spec["num_classes"] is None:
        images, rows = G(torch.randn(num, spec["z_dim"], generator=generator).to(device)), None
    else:
        labels = torch.arange(min(spec["num_classes"], GRID_ROWS)).repeat_interleave(PER_CLASS)
        z = torch.randn(len(labels), spec["z_dim"], generator=generator)
        images, rows = G(z.to(device), labels.to(device)), PER_CLASS
    return png_grid(images, rows)
