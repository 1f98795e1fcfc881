"""The model card (``README.md``) of a saved generator: what the Hugging Face Hub shows for a model repo.

Its metadata is ``huggingface_hub``'s ``ModelCardData`` (``library_name``, ``tags``, ``pipeline_tag`` for an
unconditional G, ``license`` when given, ``datasets`` when the data came from the Hub, and a ``model-index``
with the scores of the saved weights, each with its feature space as ``config``); then the sample grid, the
model, the data, the scores, the training settings and a usage snippet that runs as written (tests/test_export.py
runs it).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..errors import ConfigError
from ..storage.layout import EXPORT_SAMPLES
from ..text import printable

TRAINING_FIELDS = (("max_steps", "steps"), ("batch_size", "batch per process"), ("grad_accum_steps", "grad accum"),
                   ("n_critic", "D steps per G step"), ("loss", "loss"), ("lr_G", "lr G"), ("lr_D", "lr D"),
                   ("betas_G", "betas"), ("lr_schedule", "schedule"), ("r1_gamma", "R1 gamma"),
                   ("ema_decay", "EMA decay"), ("ema_half_life", "EMA half-life (images)"), ("augment", "augment"),
                   ("mixed_precision", "mixed precision"), ("seed", "seed"))
SHOWN_CLASSES = 20
HUB_DATA = "Hugging Face dataset "  # how the data record names a Hub dataset (gan_accel.data's description)
# The scores a model-index lists, with their names on the Hub; a Frechet distance is an FID in Inception
# features only, so "fd" keeps its own name beside the feature space it was measured in.
INDEXED = {"fid": "FID", "fd": "Frechet distance", "kid": "KID", "precision": "precision", "recall": "recall"}
LICENSE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}")  # the Hub's ids: apache-2.0, cc-by-nc-sa-4.0, other


def check_license(license: str | None) -> None:
    """Refuse, in one line, a license that is not an id: it goes into the card's YAML, where a newline or a colon
    would add metadata of its own (or break the block the Hub reads)."""
    if license is not None and not LICENSE_ID.fullmatch(license):
        raise ConfigError(f"--license '{printable(license)}' is not a license id: write the Hub's id (letters, digits, "
                          "'.', '-', '+': apache-2.0, mit, cc-by-4.0, other)")


def hub_dataset(config: dict[str, Any]) -> str | None:
    """The Hub id of the training data (``hf:NAME``, or the examples' MNIST); None for local files."""
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    source = str(data.get("source") or "")
    if source.startswith(HUB_DATA):
        return source[len(HUB_DATA):].split(" [")[0]  # without the split
    return "ylecun/mnist" if config["training"].get("extra", {}).get("dataset") == "mnist" else None


def saved_scores(config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The scores of the saved weights and their feature space: the final evaluation (``eval.json``), or the
    best one during training when it was of the saved step; nothing when the weights are another G's."""
    scores, weights = config.get("scores") or {}, config["weights"]
    if weights.get("ema") != weights.get("has_ema"):  # evaluations score the EMA when the run kept one
        return {}, None
    final, best = scores.get("eval"), scores.get("best")
    if isinstance(final, dict):
        return final, final.get("features") or f"{final.get('reference', 'mnist')}-classifier"
    if isinstance(best, dict) and best.get("step") == weights.get("step") and isinstance(best.get("scores"), dict):
        return best["scores"], config["training"].get("extra", {}).get("eval_features")
    return {}, None


def indexed(scores: dict[str, Any], space: str | None) -> list[tuple[str, float, str | None]]:
    """(score, value, feature space) of each score a model-index lists: precision and recall in the space their
    name gives (``precision_vgg16-fc2``, measured apart from the rest), the others in ``space``."""
    rows = []
    for key, value in scores.items():
        score, _, named = key.partition("_")
        if score in ("precision", "recall") and named:
            rows.append((score, value, named))
        elif key in INDEXED:
            rows.append((key, value, space))
    return [(key, float(value), config) for key, value, config in rows
            if isinstance(value, (int, float)) and not isinstance(value, bool)]


def card_data(config: dict[str, Any], license: str | None) -> ModelCardData:
    """The card's metadata (see the module docstring)."""
    spec = config["model"]
    conditional = spec.get("num_classes") is not None
    task = "class-conditional-image-generation" if conditional else "unconditional-image-generation"
    dataset = hub_dataset(config)
    scores, space = saved_scores(config)
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    named = dataset or str(data.get("source") or config["training"].get("extra", {}).get("dataset", "images"))
    results = [EvalResult(task_type=task, dataset_type=dataset or "imagefolder", dataset_name=printable(named),
                          metric_type=key, metric_name=INDEXED[key], metric_value=value, metric_config=config)
               for key, value, config in indexed(scores, space)]
    return ModelCardData(library_name="gan_accel", license=license, datasets=[dataset] if dataset else None,
                         tags=["gan", "image-generation", "gan_accel", spec["family"],
                               "class-conditional" if conditional else task],
                         pipeline_tag=None if conditional else task, model_name=title(config)[2:],
                         eval_results=results or None)


def title(config: dict[str, Any]) -> str:
    """The card's heading: the family, the size, conditional or not."""
    spec = config["model"]
    family = spec["family"].upper() if spec["family"] == "dcgan" else spec["family"].capitalize()
    return f"# {family} generator, {spec['image_size']} px" + (", class-conditional" if spec.get("num_classes") else "")


def usage(where: str, config: dict[str, Any]) -> str:
    """A Python snippet that loads G from ``where`` and draws 16 samples (one class in a conditional G)."""
    names = config.get("class_names")
    lines = ["import torch", "from torchvision.utils import save_image", "", "from gan_accel import load_generator",
             "", f"G = load_generator({where!r})  # this folder, or the Hub repo id: no training code needed",
             "z = torch.randn(16, G.z_dim, generator=torch.Generator().manual_seed(0))", "with torch.no_grad():"]
    shape = "(16, {channels}, {size}, {size})".format(channels=config["model"]["channels"],
                                                      size=config["model"]["image_size"])
    if config["model"].get("num_classes") is None:
        lines.append(f"    images = G(z)  # {shape}, values in [-1, 1]")
    else:
        first = f" ({names[0]!r}; G.class_names lists them)" if names else ""
        lines += [f"    labels = torch.full((16,), 0)  # class 0{first}",
                  f"    images = G(z, labels)  # {shape}, values in [-1, 1]"]
    lines.append('save_image(images, "generated.png", nrow=4, normalize=True, value_range=(-1, 1))')
    return "\n".join(lines)


def _model_section(config: dict[str, Any], parameters: int) -> list[str]:
    spec, weights = config["model"], config["weights"]
    kind = "the exponential moving average (EMA) of G" if weights["ema"] else "G itself (the run kept no EMA)" \
        if not weights.get("has_ema") else "the raw G (not its EMA)"
    classes = spec.get("num_classes")
    return ["## Model", "",
            f"A {spec['family']} generator ({parameters:,} parameters) making {spec['channels']}-channel "
            f"{spec['image_size']}x{spec['image_size']} images from a {spec['z_dim']}-dimensional standard normal "
            "latent" + (f", conditioned on one of {classes} classes" if classes else "") + ". The weights in "
            f"`model.safetensors` are {kind} after {weights['step']:,} steps. `config.json` holds the networks' "
            "spec that rebuilds it (`gan_accel.models.build_generator`).", ""]


def _data_section(config: dict[str, Any]) -> list[str]:
    data = config.get("data")
    if not data:
        extra = config["training"].get("extra", {})
        return ["## Data", "", f"Trained on {printable(str(extra.get('dataset', 'data the run did not describe')))}.",
                ""]
    lines = ["## Data", "",
             f"{data['images']:,} images from `{printable(str(data['source']))}` at {data['resolution']} px ({data['channels']} "
             f"channel{'s' if data['channels'] > 1 else ''}, {data['crop']} crop)"
             + (f"; {data['skipped']:,} unreadable files were skipped" if data.get("skipped") else "") + "."]
    classes = data.get("classes") or {}
    if classes:
        shown = ", ".join(f"{printable(str(name))} ({count:,})" for name, count in list(classes.items())[:SHOWN_CLASSES])
        more = f", and {len(classes) - SHOWN_CLASSES} more" if len(classes) > SHOWN_CLASSES else ""
        lines += ["", f"{len(classes)} classes: {shown}{more}."]
    return lines + [""]


def _scores_section(config: dict[str, Any]) -> list[str]:
    scores = config.get("scores") or {}
    best, final = scores.get("best"), scores.get("eval")
    if not best and not final:
        return ["## Scores", "", "No evaluation was recorded for this run.", ""]
    space = config["training"].get("extra", {}).get("eval_features", "the run's evaluation features")
    lines = ["## Scores", ""]
    if best:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in best.get("scores", {}).items() if isinstance(v, (int, float)))
        lines.append(f"Best evaluation during training, at step {best['step']:,} ({best['metric']} {best['value']:.4g}, "
                     f"in {space} features): {shown}.")
    if final:
        summary = final.get("summary") or ", ".join(f"{k} {v:.4g}" for k, v in final.items()
                                                    if isinstance(v, (int, float)))
        lines += ["", "Final evaluation:", "", "```text", summary.strip(), "```"]
    lines += ["", "Distances in a feature space compare runs scored in that same space only; they are FIDs only "
              "in Inception features."]
    return lines + [""]


def _training_section(config: dict[str, Any]) -> list[str]:
    training = config["training"]
    rows = [f"| {label} | {training[name]} |" for name, label in TRAINING_FIELDS
            if training.get(name) not in (None, "none")]
    processes = training.get("extra", {}).get("num_processes")
    if processes:
        rows.append(f"| processes | {processes} |")
    return ["## Training", "", "| setting | value |", "| --- | --- |", *rows, "",
            "`config.json` holds the whole training configuration under `training`.", ""]


def _section(title: str, build: Callable[..., list[str]], *args: Any) -> list[str]:
    """A section of the card, or a line saying its record is unreadable: a ``config.json`` edited by hand (a
    string where a number was, a missing entry) gives a card that says so, not a traceback."""
    try:
        return build(*args)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return [f"## {title}", "", f"The run's `config.json` holds no readable {title.lower()} record.", ""]


def model_card(config: dict[str, Any], where: str, parameters: int, license: str | None = None) -> ModelCard:
    """The ``README.md`` of a saved G (see the module docstring); ``where`` is what the snippet loads."""
    check_license(license)
    lines = [title(config), "",
             f"A GAN generator trained with gan_accel {printable(str(config.get('gan_accel_version', '')))}.", "",
             f"![samples]({EXPORT_SAMPLES})", "",
             *_section("Model", _model_section, config, parameters), *_section("Data", _data_section, config),
             *_section("Scores", _scores_section, config), *_section("Training", _training_section, config),
             "## Usage", "", "```python", usage(where, config), "```", "",
             "`pip install gan_accel` is all it needs. Loading reads `config.json` and the safetensors weights "
             "only: no code from this repository runs.", ""]
    try:
        data = card_data(config, license)
    except (KeyError, TypeError, ValueError, AttributeError):  # a record edited by hand: the sections say which
        data = ModelCardData(library_name="gan_accel", license=license, tags=["gan", "image-generation"])
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))
