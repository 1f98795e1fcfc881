"""``gan-accel train --data PATH``: train a GAN on your own images, no code.

    gan-accel train --data photos/ --resolution 64                       # a folder (recursive), one process
    gan-accel train --data photos.zip --conditional                      # a ZIP; labels from class subfolders
    gan-accel train --data hf:user/pets:train --label-column breed --conditional
    accelerate launch -m gan_accel.cli train --data photos/ ...          # the same flags, several processes
    gan-accel train --data photos/ --output-dir runs/photos --resume latest
    gan-accel train --data photos/ --output-dir runs/photos --resume auto       # start it, or go on (a requeue)

``--data`` takes a folder of images, a ZIP of them, ``hf:NAME[:SPLIT]`` (a Hugging Face dataset) or
``hf:FOLDER`` (the imagefolder builder). Images are decoded once into a cache; bad files are skipped and
listed. Without --model, --resolution and --channels the command picks them from the images (the
largest size at most the median short side; 1 channel when all are grey), and every training setting
left out comes from the recipe table for that size and number of images (:mod:`gan_accel.recipes`); a
resume takes the run's own. Every mistake is one ``error:`` line, exit 2, before anything is written
into the run folder. The training flags are those of examples/dcgan_mnist.py; defaults: docs/own-images.md.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..augment import AUGMENTS
from ..callbacks import Callback
from ..config import ADA_SIGNALS, TrainConfig
from ..errors import ConfigError, DataError
from ..models import FAMILIES, default_spec, supported_resolutions
from ..processes import run_together
from ..recipes import FEW_IMAGES, default_recipe, family_for
from ..settle import DEFAULTS, DataFacts, SettledRun, check_given, setting, settle, spec_overrides
from .arguments import fraction, nonnegative_float, nonnegative_int, positive_int
from .choices import default_width, family_sizes, recipe_families, z_defaults
from .forecast import say_run_time
from .train_flags import add_conditional_flags, add_model_flags, add_position_flag, add_run_flags, given_settings

if TYPE_CHECKING:
    import torch

    from ..data import ImageData

# --help's figure (the CPU rows'); the run's own comes from its recipe (gan_accel.recipes)
DEFAULT_STEPS = default_recipe(32, 10_000).steps
FEATURES = ("auto", "inception", "random")  # --eval-features


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "train", help="train a GAN on a folder of images, a ZIP of them or a Hugging Face dataset",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.remember_given_flags()  # --dry-run names the settings given as such
    add_data_flags(parser)
    run = add_run_flags(parser, None, DEFAULT_STEPS,
                        output_help="run folder for samples, logs and weights (default runs/<name of the data>)")
    run.add_argument("--dry-run", action="store_true",
                     help="print the run as it would start (the data, the model and its parameters, every setting "
                          "with where it came from, the expected time) and exit without writing anything")
    run.add_argument("--eval-features", choices=FEATURES, default="auto",
                     help="--eval-every's feature space: inception (needs torch-fidelity; its weights are downloaded once), "
                          "random (a fixed random network: no download), auto: inception if it can be had, else "
                          "random (said in one line); precision and recall are in VGG-16 fc2 features where its "
                          "weights are here (with inception, downloaded once)")
    model = add_model_flags(parser, width=None, z_dim=None, r1_gamma=None,
                            width_help="channel width (default: 32 where the recipe picks dcgan, else the family's: "
                                       f"{'; '.join(f'{name} {default_width(name)}' for name in FAMILIES)})",
                            z_help=f"latent size (default: the family's: {z_defaults()})",
                            r1_help="R1 penalty on D's real images (the recipe's every 16 D steps); 0 disables (default: the "
                                    "recipe's gamma, 0.1 up to 32 px; 0 with --conditional)")
    model.add_argument("--model", choices=tuple(FAMILIES), default=None,
                       help=f"the network family (default: the recipe's: on a CPU {recipe_families(gpu=False)}; on a "
                            f"GPU {recipe_families(gpu=True)})")
    add_conditional_flags(model, label_distribution=None, class_weight=None)
    add_position_flag(model)
    augment = parser.add_argument_group("augmentation of what D sees")
    augment.add_argument("--augment", choices=AUGMENTS, default=None,
                         help="diffaugment: colour, translation, cutout on every image D sees; ada: the same kind, "
                              "with a probability steered by D's overfitting (default: ada for up to "
                              f"{FEW_IMAGES:,} images, else none)")
    augment.add_argument("--augment-p", type=nonnegative_float, default=None,
                         help="diffaugment: each transform's probability (default 1); ada: the first p (default 0)")
    augment.add_argument("--ada-target", type=fraction, default=DEFAULTS["ada_target"],
                         help="ada: the E[sign(D(real))] (rpgan: of D(real) - D(fake)) that p steers towards; "
                              "with --ada-signal heldout: D's held-out overfit ratio")
    augment.add_argument("--ada-signal", choices=ADA_SIGNALS, default=DEFAULTS["ada_signal"],
                         help="ada: what steers p: ADA's r_t, or D's gap between training and held-out images")
    # Left out, the recipe's settings come from its table (gan_accel.settle), chosen once the data is known.
    parser.set_defaults(run=train, loss=None, lr_g=None, lr_d=None, beta1=None, beta2=None, r1_every=None,
                        ema_decay=None, augment=None)


def add_data_flags(parser: argparse.ArgumentParser) -> None:
    """`gan-accel train`'s data flags: where the images are and how they become training batches."""
    data = parser.add_argument_group("data")
    data.add_argument("--data", required=True, metavar="PATH",
                      help="a folder of images (searched recursively), a .zip of them, hf:NAME[:SPLIT] (a Hugging "
                           "Face dataset) or hf:FOLDER (the imagefolder builder)")
    data.add_argument("--resolution", type=positive_int, default=None,
                      help="the side of the square images trained on, in pixels (default: the largest the model "
                           f"makes at or below the images' median short side): {family_sizes()}")
    data.add_argument("--crop", choices=("center", "random"), default=None,
                      help="center (the default; a resume: the run's): the central square of the image resized to "
                           "the resolution (short side); random: a random window of it, chosen anew at every draw")
    data.add_argument("--channels", type=int, choices=(1, 3), default=None,
                      help="1 (grayscale) or 3 (RGB) (default: 1 when every image is grayscale, else 3)")
    data.add_argument("--random-flip", action="store_true", help="mirror each image left-right with probability 1/2")
    data.add_argument("--num-workers", type=nonnegative_int, default=None, metavar="N",
                      help="data loading worker processes (default: none for cached images, whose batch is one "
                           "memory copy; else the cores per process, at most 8)")
    data.add_argument("--background", choices=("white", "black"), default=None,
                      help="what transparent pixels become (default white; a resume: the run's)")
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


def train(args: argparse.Namespace) -> int:
    """The command: the run folder, the model and resolution, the data, the config, then training."""
    import torch
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    from ..engine import GANTrainer
    from ..engine.launch import check_launch, describe_launch
    from ..models import build_models

    if args.dry_run:
        from .dry_run import dry_run

        return dry_run(args)
    recorded, recorded_data, family = settle_run(args)
    # The processes of the launch, before the data (one process per machine builds its cache); the trainer
    # builds the Accelerator on this same state once the config is known (cpu: as Accelerator reads it).
    # torch's collective timeout bounds the data build's waits too (gan_accel.ending).
    processes = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"),
                             timeout=timedelta(seconds=args.collective_timeout))
    check_launch(processes)
    log = processes.print
    given = given_settings(args)
    batch_size = setting("batch_size", given, recorded)  # before the data: how many images to hold out
    data = open_data(args, family, processes, log, batch_size)
    data.check_resume(recorded_data, allow_changed=args.allow_data_change, log=log)
    monitor = held_out_monitor(args, data, recorded_data, processes.num_processes, log,
                               setting("seed", given, recorded), batch_size)
    run = settle_data(args, given, recorded, data, processes, log)
    config, spec = run.config, run.spec
    loader = data.dataloader(config.batch_size, random_flip=args.random_flip, num_workers=args.num_workers,
                             seed=config.seed)
    callbacks: list[Any] = [RunDataFiles(data), monitor, *overfit_steering(config, monitor, args.conditional)]
    config.extra = {**data_extra(data), "num_processes": processes.num_processes}
    if args.eval_every:
        evaluator, config.extra["eval_features"] = build_evaluator(args, data, processes.device, log, config.seed)
        callbacks.append(evaluator)

    torch.manual_seed(config.seed)  # the same initial weights on every process (DDP also broadcasts them)
    G, D = build_models(spec)
    trainer = GANTrainer(G, D, loader, config, callbacks=callbacks)
    classes = f", {spec['num_classes']} classes" if args.conditional else ""
    log(f"gan_accel: {spec['family']} G and D (width {spec['width']}, z {spec['z_dim']}) at {spec['image_size']} px, "
        f"{spec['channels']} channel(s){classes}; {config.max_steps} steps of {config.batch_size} x "
        f"{config.grad_accum_steps} images per process; {describe_launch(trainer.accelerator)}; output in "
        f"{config.output_dir}")
    say_run_time(args, spec, spec_overrides(given, spec["family"]), config,
                 on_cpu=trainer.accelerator.device.type == "cpu", log=log)
    metrics = trainer.fit(resume_from=args.resume)
    # One line per process, so a multi-process launch shows that every rank trained its share.
    print(f"process {processes.process_index}/{processes.num_processes}: {trainer.step} steps, "
          f"{trainer.images_seen} images in batches of {config.batch_size}", flush=True)
    log("final: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))
    log(f"next: gan-accel sample {config.output_dir} --num 64 --out grid.png; share it: gan-accel export "
        f"{config.output_dir} EXPORT_DIR")
    trainer.accelerator.wait_for_everyone()
    return 0


def settle_run(args: argparse.Namespace) -> tuple[TrainConfig | None, dict[str, Any] | None, str | None]:
    """Before any data is read: the run folder looked at once, the data flags a resume leaves out filled in from the
    run's records, the model flags checked when the family is known; returns the resumed run's config and data
    record (None for a new run), and the model family (None until the images give the resolution)."""
    from ..data.image_data import check_outside_data

    if not args.data.strip():
        raise DataError("--data is empty: pass a folder of images, a .zip of them or hf:NAME (--data . for the "
                        "current folder)")
    args.output_dir = args.output_dir or default_output_dir(args.data)
    check_outside_data(args.data, args.output_dir, "the run folder", "pass --output-dir outside it")
    recorded, recorded_data = check_run_folder(args)
    recorded_spec = recorded.model if recorded is not None else None
    check_same_run(args, recorded_spec or {}, recorded_data or {})
    args.crop = args.crop or (recorded_data or {}).get("crop") or "center"
    args.background = args.background or (recorded_data or {}).get("background") or "white"
    if recorded_spec is not None:  # resuming: --model, --resolution and --channels left out are the run's own
        args.model = args.model or recorded_spec["family"]
        args.resolution = args.resolution or recorded_spec.get("image_size")
        args.channels = args.channels or recorded_spec.get("channels")
    if args.model or args.resolution:  # the flags' mistakes before the data (checked again once it is read)
        check_model(args, args.model or family_for(args.resolution, gpu=False))
    return recorded, recorded_data, args.model


def settle_data(args: argparse.Namespace, given: dict[str, Any], recorded: TrainConfig | None, data: ImageData,
                processes: Any, log: Callable[[str], Any]) -> SettledRun:
    """The run settled (:func:`gan_accel.settle.settle`) once the data is known, and its notes said; the run folder
    is the command's own default."""
    facts = DataFacts(data.prep.resolution, len(data), data.prep.channels,
                      len(data.class_names) if args.conditional else None, trained=data.trained_on)
    run = settle(given, facts, gpu=processes.device.type == "cuda", processes=processes.num_processes,
                 recorded=recorded, defaults={"output_dir": args.output_dir})
    for note in run.notes:
        log(note)
    return run


def default_output_dir(data: str) -> str:
    """``runs/<name>``: the data folder's or ZIP's name, or the Hugging Face dataset's (``hf:user/pets:train`` -> pets)."""
    text = str(data).rstrip("/\\")
    if text.startswith("hf:"):
        text = re.sub(r":[^/\\:]*$", "", text[3:]) if text.count(":") > 1 else text[3:]
    name = Path(text).stem or Path(text).resolve().name
    return f"runs/{name or 'images'}"


def check_same_run(args: argparse.Namespace, spec: dict[str, Any], record: dict[str, Any]) -> None:
    """On resume, before the data: --model, --resolution, --channels, --crop and --background that differ from
    the run's own are named as such (its networks are built for them; its data was prepared so)."""
    given = (("--model", args.model, spec.get("family")), ("--resolution", args.resolution, spec.get("image_size")),
             ("--channels", args.channels, spec.get("channels")), ("--crop", args.crop, record.get("crop")),
             ("--background", args.background, record.get("background")))
    changed = [f"{flag} {value} (the run's: {saved})" for flag, value, saved in given
               if value is not None and saved is not None and value != saved]
    if changed:
        raise ConfigError(f"{', '.join(changed)}: a run resumes as it started; leave these flags out to resume "
                          f"{args.output_dir} as it is, or start a new run in another --output-dir")


def check_run_folder(args: argparse.Namespace) -> tuple[TrainConfig | None, dict[str, Any] | None]:
    """The one look at ``--output-dir``, read-only and before the data: a new run does not land on another; a
    resume names a checkpoint, and gives the run's config (with the networks' spec) and the data record
    (``data.json``) the run kept."""
    from ..engine.run_open import AUTO, resolve_auto, resume_target
    from ..storage.checkpoint import read_marker
    from ..storage.layout import CONFIG, DATA_RECORD, read_json
    from ..storage.run_folder import check_new_run

    resume = resolve_auto(args.output_dir) if args.resume == AUTO else args.resume  # fit() decides again, locked
    if resume is None:
        check_new_run(args.output_dir)
        return None, None
    target = resume_target(resume, args.output_dir)
    if not target.continued:  # a fork: the checkpoint's settings (fixed ones must match), its data free to change
        return _config_or_none(read_marker(target.path).get("config")), None
    folder = Path(args.output_dir)
    try:
        config = _config_or_none(read_json(folder / CONFIG))
    except (OSError, ValueError):
        config = None  # unreadable: the run is settled as a new one, and fit() compares
    try:
        record = read_json(folder / DATA_RECORD)  # the one reader: a FIFO or a huge file is one line, not a hang
    except FileNotFoundError:
        record = None  # trained on something else: nothing to compare
    except (OSError, ValueError) as error:
        raise DataError(f"{folder / DATA_RECORD} cannot be read ({error}): restore it, or start a new run") from None
    return config, record


def _config_or_none(saved: Any) -> TrainConfig | None:
    """A recorded config with its networks' spec, or None (absent, or another version's: settled as a new run)."""
    try:
        config = TrainConfig.from_dict(saved)
    except (ValueError, TypeError, AttributeError, ConfigError):
        return None
    return config if isinstance(config.model, dict) and "family" in config.model else None


def check_model(args: argparse.Namespace, family: str) -> None:
    """Before the data: the model flags fit ``family``, and the family makes ``--resolution`` when it is given;
    one line for a flag that does not fit."""
    if not args.conditional and args.label_column is not None:
        raise ConfigError("--label-column is a setting of a class-conditional run: add --conditional (labels from "
                          "class subfolders or a class column), or leave it out")
    given = given_settings(args)
    check_given(given, args.conditional)
    overrides = spec_overrides(given, family)
    if args.resolution is not None:
        default_spec(family, args.resolution, args.channels or 3, 2 if args.conditional else None, **overrides)


def default_resolution(family: str | None, sizes: list[tuple[int, int]]) -> tuple[int, str]:
    """The largest size ``family`` makes at or below the images' median short side (the lower middle one
    for an even count; the smallest size when they are all smaller), and one line saying why."""
    made = supported_resolutions(family or "resnet")  # no --model: every size the table has
    if not sizes:
        return made[0], ""
    side = sorted(min(w, h) for w, h in sizes)[(len(sizes) - 1) // 2]
    fitting = [size for size in made if size <= side]
    chosen = fitting[-1] if fitting else made[0]
    why = "the largest" if fitting else "the smallest (the images are upscaled)"
    maker = f"the {family} family makes" if family else "gan_accel's models make"
    return chosen, (f"gan_accel: {chosen} px: {why} size {maker} for images whose median short "
                    f"side is {side} px (choose with --resolution)")


def open_data(args: argparse.Namespace, family: str | None, processes: Any, log: Callable[[str], Any],
              batch_size: int) -> ImageData:
    """List and scan the data once, choose the resolution when it is not given, and open it (fewer images than one
    batch of ``batch_size`` refused before decoding)."""
    from ..data import Preprocessing, scan_images

    images = scan_images(args.data, "required" if args.conditional else "none", split=args.split,
                         image_column=args.image_column, label_column=args.label_column, cache_dir=args.cache_dir,
                         accelerator=processes)
    resolution = args.resolution
    if resolution is None:
        resolution, why = default_resolution(family, images.sizes)
        if why:
            log(why)
    data = images.open(Preprocessing(resolution, args.channels, args.crop, args.background),
                       batch_size=batch_size, log=log)
    if args.conditional and len(data.class_names or []) < 2:
        raise DataError(f"a conditional run needs at least 2 classes, and {data.report.source} has "
                        f"{len(data.class_names or [])}: add classes, or train unconditionally")
    return data


def held_out_monitor(args: argparse.Namespace, data: ImageData, recorded: dict[str, Any] | None, processes: int,
                     log: Callable[[str], Any], seed: int, batch_size: int) -> Callback:
    """The health monitor, with a slice of the images held out of training for D's overfitting check
    (:meth:`ImageData.hold_out`): a new run chooses it from ``--seed``; a resumed one keeps the names its
    ``data.json`` recorded (none for a run that started training on every image)."""
    from ..callbacks import HealthMonitor
    from ..data import uint8_to_float
    from ..data.image_data import HOLD_OUT_MIN_IMAGES

    if recorded is not None:
        names = recorded.get("held_out")
        count = data.hold_out(recorded=[str(n) for n in names] if isinstance(names, list) else [])
    else:
        count = data.hold_out(seed, batch_size=batch_size * processes)
    if not count:
        why = "the run started training on every image" if recorded is not None else \
            f"fewer than {HOLD_OUT_MIN_IMAGES} images, each one is trained on"
        log(f"gan_accel: no images held out ({why}): D's overfitting check is off")
        return HealthMonitor()
    images, labels = data.held_out()
    log(f"gan_accel: {count} of the {len(data):,} images held out of training for D's overfitting check "
        "(health/overfit)")
    held = uint8_to_float(images)
    return HealthMonitor(held_out=(held, labels) if args.conditional else held)


def overfit_steering(config: TrainConfig, monitor: Any, conditional: bool) -> list[Callback]:
    """ADA steered by the held-out gap (``--augment ada --ada-signal heldout``): its callback, on the
    monitor's held-out images; one line when there are none."""
    if not check_steering(config, 0 if monitor.held_out is None else len(monitor.held_out)):
        return []
    from ..callbacks import OverfitSteering

    return [OverfitSteering((monitor.held_out, monitor.held_labels) if conditional else monitor.held_out)]


def check_steering(config: TrainConfig, held_out: int) -> bool:
    """Whether the run steers ADA by the held-out gap; one line when it would but holds no images out."""
    if config.augment != "ada" or config.ada_signal != "heldout":
        return False
    if not held_out:
        raise ConfigError("--ada-signal heldout steers ADA by D's held-out images, but this run holds none out "
                          "(too few images, or a run that started without): use --ada-signal rt")
    return True


def data_extra(data: ImageData) -> dict[str, Any]:
    """What the run's config records about its data (``config.extra``)."""
    return {"dataset": Path(data.report.source).name or data.report.source, "data_source": data.report.source,
            "data_fingerprint": data.fingerprint, "images": len(data),
            "classes": len(data.class_names) if data.class_names else None, "channels": data.prep.channels,
            "resolution": data.prep.resolution, "crop": data.prep.crop}


MIN_EVAL_IMAGES = 2  # the Fréchet distance needs the covariance of the real features


def build_evaluator(args: argparse.Namespace, data: ImageData, device: Any, log: Callable[[str], Any],
                    seed: int) -> tuple[Any, str]:
    """The :class:`~gan_accel.callbacks.Evaluator` of ``--eval-every``, and the name of its feature space: real
    features computed once, from up to :data:`REFERENCE_IMAGES` images (a fixed, seeded choice, centre crops)."""
    from ..callbacks import Evaluator
    from ..data import uint8_to_float
    from ..eval import compute_features
    from ..eval.random_features import choose_features
    from ..eval.vgg import precision_recall_features

    if len(data) < MIN_EVAL_IMAGES:  # before any feature extractor is loaded or downloaded, and before training
        raise DataError(f"--eval-every: {args.data} has {len(data)} readable image, and an evaluation compares the "
                        f"spread of the real images with the samples', which needs at least {MIN_EVAL_IMAGES}: add "
                        "images, or leave out --eval-every")
    features, logits, name = choose_features(args.eval_features, device, log)
    pr_extractor, pr_name = precision_recall_features(name, device, log)
    real = data.real_images(seed=seed)

    def reference(extractor: Any) -> torch.Tensor:  # a chunk at a time: 10,000 images at 256 px are 7.9 GB in float
        return compute_features(extractor, (uint8_to_float(part) for part in real.split(250)))

    log(f"gan_accel: evaluation every {args.eval_every} steps: {args.eval_samples} samples against {len(real)} real "
        f"images in {name} features (precision and recall in {pr_name} features)")
    pr = {} if pr_extractor is None else dict(pr_extractor=pr_extractor, pr_reference=reference(pr_extractor),
                                              pr_features=pr_name)
    return Evaluator(features, reference(features), every=args.eval_every, num_samples=args.eval_samples, metric="fd",
                     logits=logits, seed=1234, features=name, **pr), name


class RunDataFiles(Callback):
    """Writes the data's files into the run folder as training starts (``data.json``, ``class_names.json``,
    ``skipped_files.txt``: :meth:`ImageData.write_run_files`)."""

    def __init__(self, data: ImageData) -> None:
        self.data = data

    def on_fit_start(self, trainer: Any) -> None:
        run_together(trainer.accelerator, lambda: self.data.write_run_files(trainer.output_dir), main_only=True)
