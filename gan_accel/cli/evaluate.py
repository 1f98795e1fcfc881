"""``gan-accel eval RUN_OR_CHECKPOINT``: score a run's generator.

Without ``--data``, against MNIST with the MNIST classifier: FD, KID, precision and recall in the
classifier's features, the share of each predicted digit and the mean confidence (a conditional run:
the share of each requested digit read as that digit). A run trained on the built-in offline digits is
scored against that set, and the report says so.

With ``--data PATH`` (a folder, a ZIP or ``hf:NAME``), against those images: FID in Inception-v3
features when torch-fidelity is installed (its weights, about 91 MB, are downloaded once into torch
hub's cache), else a fixed random network's features (said in one line); precision and recall in
VGG-16 fc2 features, the published protocol's, where its weights are here (with Inception, downloaded
once, about 528 MB), else in the same features as the rest (said in one line). The report names the
feature spaces, and the real images' features are cached per dataset, resolution and feature space.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..hub import load_generator
from ..eval.mnist import MAX_EVAL_SAMPLES
from .arguments import bounded_int, seed_int
from ..errors import DataError
from .common import CommandError, check_new_output, resolve_source, write_new_file


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "eval", help="score a run or checkpoint: FD, KID, precision, recall and digit shares (MNIST classifier)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a finished run folder or any of its checkpoints/checkpoint_<step>")
    parser.add_argument("--data", default=None, metavar="PATH",
                        help="score against these images instead of MNIST: a folder, a .zip or hf:NAME[:SPLIT]")
    parser.add_argument("--features", choices=("auto", "inception", "random"), default="auto",
                        help="with --data: Inception-v3 (FID; needs gan_accel[inception]; its weights are downloaded "
                             "once, or set GAN_ACCEL_INCEPTION_WEIGHTS), a fixed random network, or auto (Inception "
                             "when it loads)")
    parser.add_argument("--seed", type=seed_int, default=0, help="with --data: the samples' latents")
    parser.add_argument("--data-dir", default=os.environ.get("GAN_ACCEL_DATA_DIR", "./data"),
                        help="where MNIST is: DIR/MNIST/raw (env GAN_ACCEL_DATA_DIR)")
    parser.add_argument("--download", action="store_true",
                        help="download MNIST into --data-dir when it is not there (needs network access)")
    parser.add_argument("--num", type=bounded_int(4, MAX_EVAL_SAMPLES, "precision and recall compare every pair"),
                        default=10_000, help="samples to score, at least 4 (precision and recall read 3 nearest neighbours; made and "
                        "scored a chunk at a time)")
    parser.add_argument("--no-ema", action="store_true", help="score the raw G instead of its EMA")
    parser.add_argument("--out", default=None, help="also write the scores as JSON to this new file (an existing "
                        "file is never replaced)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..eval.mnist import evaluate_conditional_generator, evaluate_generator

    source = resolve_source(args.source)
    out = Path(args.out) if args.out else None
    if out is not None:
        check_new_output(out)
    G = load_generator(source, ema=not args.no_ema)
    info = G.info
    if args.data is not None:
        result = evaluate_on_data(G, args.data, args.num, args.features, args.seed)
        return _report(result, args, info, out)
    model = info["model"]
    if (model.get("channels"), model.get("image_size")) != (1, 28):  # the MNIST classifier reads 1x28x28 digits
        raise CommandError(f"{args.source} makes {model.get('channels')}x{model.get('image_size')}px images; without "
                           "--data it is scored as MNIST digits (1 channel, 28 px): pass --data with its images")
    fallback = offline_digits(info)
    if info["model"]["num_classes"] is not None:
        result = evaluate_conditional_generator(G, args.data_dir, z_dim=G.z_dim, per_class=max(1, args.num // 10),
                                                fallback=fallback, download=args.download)
    else:
        result = evaluate_generator(G, args.data_dir, z_dim=G.z_dim, num_samples=args.num, fallback=fallback,
                                    download=args.download)
    return _report(result, args, info, out)


def _report(result: dict, args: argparse.Namespace, info: dict, out: Path | None) -> int:
    print(result.pop("summary"))
    result.setdefault("features", "mnist-classifier")  # the feature space of every distance in the file
    result.update(source=str(args.source), step=info["weights"]["step"], ema=info["weights"]["ema"])
    if out is not None:
        write_new_file(out, (json.dumps(result, indent=2) + "\n").encode())
        print(f"wrote {out}")
    return 0


def offline_digits(info: dict):
    """The built-in digit set when the run trained on it (its scores are then against that set)."""
    if info["training"].get("extra", {}).get("dataset") in (None, "mnist"):
        return None
    from ..data import resolve_dataset

    return resolve_dataset("digits", ".", log=None)


def evaluate_on_data(G: nn.Module, source: str, num: int, features: str = "auto",
                     seed: int = 0, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Scores of ``num`` samples of G against up to ``EVAL_IMAGES`` images of ``source`` (a folder, ZIP or ``hf:``
    name) at G's resolution; the real features are cached per dataset, resolution and feature space."""
    from ..data import open_image_data, uint8_to_float
    from ..eval import compute_features, score_features
    from ..eval.feature_cache import cached_features
    from ..eval.random_features import choose_features
    from ..eval.scores import distance_name, pr_names
    from ..eval.vgg import precision_recall_features
    from ..sampling import iter_samples
    from ..data.image_data import EVAL_IMAGES

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    channels, resolution = G.info["model"]["channels"], G.info["model"]["image_size"]
    data = open_image_data(source, resolution=resolution, channels=channels, labels="none", log=log)
    extractor, _, space = choose_features(features, device, log)
    count = min(len(data), EVAL_IMAGES)
    if count < 4:  # precision and recall read each image's 3 nearest neighbours
        raise DataError(f"{source} has {count} readable image{'s' if count > 1 else ''}: scoring needs at least 4; "
                        "add images")
    pr_extractor, pr_space = precision_recall_features(space, device, log)

    def real_features(net: nn.Module) -> Callable[[], torch.Tensor]:
        return lambda: compute_features(net, (uint8_to_float(part) for part in data.real_images(count).split(250)))

    def both(images: torch.Tensor) -> torch.Tensor:  # one pass over the samples for both feature spaces
        return torch.cat([extractor(images), pr_extractor(images)], dim=1)

    real, reused = cached_features(data.fingerprint, space, count, real_features(extractor))
    samples = (images for images, _ in iter_samples(G.to(device), num, seed=seed))
    fake = compute_features(extractor if pr_extractor is None else both, samples)
    pr = {}
    if pr_extractor is not None:
        pr_real, pr_reused = cached_features(data.fingerprint, pr_space, count, real_features(pr_extractor))
        fake, pr_fake = fake.split([real.shape[1], fake.shape[1] - real.shape[1]], dim=1)
        pr, reused = dict(pr_fake=pr_fake, pr_real=pr_real, pr_features=pr_space), reused and pr_reused
    scores = score_features(fake, real, kid_subset_size=min(1000, len(fake), len(real)), seed=0, features=space,
                            **pr)
    distance, (precision, recall) = distance_name(space), pr_names(pr_space)
    summary = "\n".join([
        f"evaluation against {source} ({len(fake)} samples vs {len(real)} real images at {resolution} px, in "
        f"{space} features{'; real features from the cache' if reused else ''})",
        f"  {'FID' if distance == 'fid' else 'Frechet distance'} ({distance}): {scores[distance]:.3f}",
        f"  KID: {scores['kid'] * 1000:.3f} +- {scores['kid_std'] * 1000:.3f} (x 1e-3)",
        f"  precision {scores[precision]:.3f}, recall {scores[recall]:.3f} (k-NN manifolds, k = 3, in {pr_space} "
        "features)",
    ])
    return {"summary": summary, "data": source, "features": space, "pr_features": pr_space, "samples": len(fake),
            "real_images": len(real), "resolution": resolution, **{k: float(v) for k, v in scores.items()}}
