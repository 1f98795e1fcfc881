"""``gan-accel train --data PATH``: train a GAN on your own images, no code.

    gan-accel train --data photos/ --resolution 64                       # a folder (recursive), one process
    gan-accel train --data photos.zip --conditional                      # a ZIP; labels from class subfolders
    gan-accel train --data hf:user/pets:train --label-column breed --conditional
    accelerate launch -m gan_accel.cli train --data photos/ ...          # the same flags, several processes
    gan-accel train --data photos/ --output-dir runs/photos --resume latest

``--data`` takes a folder of images, a ZIP of them, ``hf:NAME[:SPLIT]`` (a Hugging Face dataset) or
``hf:FOLDER`` (the imagefolder builder). Images are resized (short side) and centre-cropped to a square
(``--crop random``: a random window), decoded once into a cache; bad files are skipped and listed. The
model fits the resolution (DCGAN for 28/32/64 px, the residual family up to 256 px; ``--model``,
``--width``). With ``--conditional`` the labels come from class subfolders or the dataset's class column,
and ``gan-accel sample --label NAME`` samples one class. The training flags are those of
examples/dcgan_mnist.py, with the same names and meanings. Defaults: docs/own-images.md.

Every mistake (an empty folder, fewer images than a batch, a ZIP that is not one, no image column, a
resolution the model cannot make, --conditional without labels, data changed under a resumed run) is
one ``error:`` line, exit 2, before anything is written into the run folder.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..augment import AUGMENTS
from ..config import TrainConfig
from ..scripts import fraction, nonnegative_float, positive_int
from .train_flags import add_conditional_flags, add_model_flags, add_run_flags, config_fields, steps_for

if TYPE_CHECKING:
    from ..data import ImageData

# The MNIST examples' defaults (docs/benchmarks.md), until an ablation on other images says otherwise.
DEFAULT_STEPS = 5000
DEFAULT_R1_GAMMA = {False: 0.1, True: 0.0}
FEATURES = ("auto", "inception", "random")  # --eval-features (gan_accel/cli/train_eval.py)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "train", help="train a GAN on a folder of images, a ZIP of them or a Hugging Face dataset",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--data", required=True, metavar="PATH",
                      help="a folder of images (searched recursively), a .zip of them, hf:NAME[:SPLIT] (a Hugging "
                           "Face dataset) or hf:FOLDER (the imagefolder builder)")
    data.add_argument("--resolution", type=positive_int, default=None,
                      help="the side of the square images trained on, in pixels (default: the largest the model "
                           "makes at or below the images' median short side; at most 64 unless --model resnet)")
    data.add_argument("--crop", choices=("center", "random"), default="center",
                      help="center: the central square of the image resized to the resolution (short side); "
                           "random: a random window of it, chosen anew at every draw")
    data.add_argument("--channels", type=int, choices=(1, 3), default=None,
                      help="1 (grayscale) or 3 (RGB) (default: 1 when every image is grayscale, else 3)")
    data.add_argument("--random-flip", action="store_true", help="mirror each image left-right with probability 1/2")
    data.add_argument("--background", choices=("white", "black"), default="white",
                      help="what transparent pixels become")
    data.add_argument("--image-column", default=None, help="a Hugging Face dataset's image column (default: the "
                      "column of type Image)")
    data.add_argument("--label-column", default=None, help="with --conditional: a Hugging Face dataset's class "
                      "column (default: the column of type ClassLabel)")
    data.add_argument("--split", default=None, help="a Hugging Face dataset's split (default: train, or the only one)")
    data.add_argument("--conditional", action="store_true",
                      help="class-conditional G and D; labels from class subfolders (or the class column)")
    data.add_argument("--cache-dir", default=None,
                      help="where the decoded images are cached (default $GAN_ACCEL_CACHE/images, else "
                           "~/.cache/gan_accel/images)")
    data.add_argument("--allow-data-change", action="store_true",
                      help="with --resume: go on although the data changed since the run started")
    run = add_run_flags(parser, None, DEFAULT_STEPS,
                        output_help="run folder for samples, logs and weights (default runs/<name of the data>)")
    run.add_argument("--eval-features", choices=FEATURES, default="auto",
                     help="--eval-every's feature space: inception (needs torch-fidelity and its weights here), "
                          "random (a fixed random network: no download), auto: inception if it loads, else random")
    model = add_model_flags(parser, width=None, z_dim=None, r1_gamma=None,
                            width_help="channel width (default: the family's, 64; resnet at 28 px: 32)",
                            z_help="latent size (default: the family's, dcgan 100, resnet 128)",
                            r1_help="lazy R1 penalty on D's real images, every 16 D steps; 0 disables (default 0.1; "
                                    "0 with --conditional)")
    model.add_argument("--model", choices=("dcgan", "resnet"), default=None,
                       help="the network family (default: dcgan up to 64 px, resnet above)")
    add_conditional_flags(model, d_position=None, d_position_help="dcgan family: how the conditional D sees where "
                          "things are: coordinate channels (the default), spatial moments, or not at all",
                          label_distribution=None, class_weight=None)
    augment = parser.add_argument_group("augmentation of what D sees")
    augment.add_argument("--augment", choices=AUGMENTS, default="none",
                         help="diffaugment: colour, translation, cutout on every image D sees; ada: the same kind, "
                              "with a probability steered by D's overfitting")
    augment.add_argument("--augment-p", type=nonnegative_float, default=None,
                         help="diffaugment: each transform's probability (default 1); ada: the first p (default 0)")
    augment.add_argument("--ada-target", type=fraction, default=0.6,
                         help="ada: the E[sign(D(real))] that p steers towards")
    parser.set_defaults(run=train)


def provisional_config(args: argparse.Namespace, family: str) -> TrainConfig:
    """The config from the flags alone, validated before the data is read (classes and length come later)."""
    from . import train_setup as setup

    if args.r1_gamma is None:
        args.r1_gamma = DEFAULT_R1_GAMMA[args.conditional]
    fields = {**config_fields(args), "z_dim": setup.z_dim_of(args, family)}
    return TrainConfig(**fields, augment=args.augment, augment_p=args.augment_p, ada_target=args.ada_target)


def finish_config(config: TrainConfig, args: argparse.Namespace, spec: dict[str, Any], data: "ImageData",
                  batches: int, processes: int) -> None:
    """The settings that depend on the data: classes, length, the networks' spec and what the run records."""
    from .train_setup import data_extra

    if args.conditional:
        classes = spec["num_classes"]
        config.num_classes = classes
        config.num_samples = classes * max(1, min(8, 256 // classes))  # one grid row per class
        config.label_distribution = args.label_distribution or "data"
        config.class_loss_weight = 1.0 if args.class_weight is None else args.class_weight
    config.max_steps = steps_for(args, batches // processes, DEFAULT_STEPS, processes)
    config.model = spec  # what gan-accel sample and export rebuild G from; fixed on resume
    config.extra = {**data_extra(data), "num_processes": processes}
    config.validate()


def train(args: argparse.Namespace) -> int:
    """The command: decide (model, resolution, data, run folder), then train; see the module docstring."""
    import torch

    from ..engine import GANTrainer, build_accelerator
    from ..engine.launch import describe_launch
    from ..models import build_models
    from . import train_setup as setup
    from .train_eval import build_evaluator

    args.output_dir = args.output_dir or setup.default_output_dir(args.data)
    setup.fill_from_run(args)
    family = setup.family_of(args)
    setup.check_model(args, family)
    config = provisional_config(args, family)
    setup.check_run_folder(args)
    accelerator = build_accelerator(config)
    log = accelerator.print
    data = setup.open_data(args, family, accelerator, log)
    spec = setup.model_spec(args, family, data)
    if args.resume is not None:
        data.check_resume(args.output_dir, allow_changed=args.allow_data_change, log=log)
    loader = data.dataloader(args.batch_size, random_flip=args.random_flip, seed=args.seed)
    finish_config(config, args, spec, data, len(loader), accelerator.num_processes)
    callbacks: list[Any] = [setup.RunDataFiles(data)]
    if args.eval_every:
        evaluator, features = build_evaluator(args, data, accelerator, log)
        callbacks.append(evaluator)
        config.extra["eval_features"] = features

    torch.manual_seed(args.seed)  # the same initial weights on every process (DDP also broadcasts them)
    G, D = build_models(spec)
    trainer = GANTrainer(G, D, loader, config, accelerator=accelerator, callbacks=callbacks)
    classes = f", {spec['num_classes']} classes" if args.conditional else ""
    log(f"gan_accel: {family} G and D (width {spec['width']}, z {spec['z_dim']}) at {spec['image_size']} px, "
        f"{spec['channels']} channel(s){classes}; {config.max_steps} steps of {args.batch_size} x {args.grad_accum} images per "
        f"process; {describe_launch(accelerator)}; output in {config.output_dir}")
    metrics = trainer.fit(resume_from=args.resume)
    # One line per process, so a multi-process launch shows that every rank trained its share.
    print(f"process {accelerator.process_index}/{accelerator.num_processes}: {trainer.step} steps, "
          f"{trainer.images_seen} images in batches of {args.batch_size}", flush=True)
    log("final: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))
    log(f"next: gan-accel sample {config.output_dir} --num 64 --out grid.png; share it: gan-accel export "
        f"{config.output_dir} EXPORT_DIR")
    accelerator.wait_for_everyone()
    return 0
