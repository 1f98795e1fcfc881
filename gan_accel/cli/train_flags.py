"""The training flags that ``gan-accel train`` and the example scripts share: the same names, the same meanings.

Each script adds its own flags beside these. Their defaults are the one table's, :data:`gan_accel.settle.DEFAULTS`,
which settles the run (:func:`gan_accel.settle.settle` reads only the flags given); a default of None in
:func:`add_model_flags` is one the caller fills in later (``gan-accel train``: the model family's width and latent
size).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..config import MAX_BATCHES_PER_STEP
from ..models.dcgan import POSITIONS
from ..settle import DEFAULTS
from .arguments import bounded_int, duration, fraction, nonnegative_float, positive_float, positive_int, seed_int
from .choices import loss_names

TRACKERS_HELP = ("also log metrics and sample grids to these trackers through Accelerate (space or comma separated): "
                 "tensorboard, wandb, mlflow, trackio, aim, comet_ml, clearml, dvclive, swanlab, or all (the installed "
                 "ones); TensorBoard writes to <output-dir>/trackers/<project>")


def add_run_flags(parser: argparse.ArgumentParser, output_dir: str | None, default_steps: int,
                  output_help: str = "run folder for samples, logs and weights") -> argparse._ArgumentGroup:
    """The "run" group: length, batch, precision, logging, trackers, checkpoints, resume, evaluation during training.

    Callers may add their own flags to the group it returns (the examples' ``--eval``). The parser also reads
    diffusers' and NVlabs' names for these flags (:data:`gan_accel.cli.aliases.TRAINING`)."""
    from .aliases import TRAINING

    if hasattr(parser, "read_aliases"):  # gan_accel's ArgumentParser
        parser.read_aliases(TRAINING)
    run = parser.add_argument_group("run")
    run.add_argument("--output-dir", default=output_dir, help=output_help)
    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int, default=None,
                        help=f"generator optimizer steps (default {default_steps})")
    length.add_argument("--epochs", type=positive_float, default=None, help="train for this many passes over the data instead")
    length.add_argument("--images", type=positive_int, default=None,
                        help="train until this many real images were seen (all processes together) instead")
    run.add_argument("--max-time", type=duration, default=None, metavar="TIME",
                     help="stop cleanly after this much training (5400, 90m, 2h, 1h30m): a checkpoint and the final "
                          "generator are written, and --resume latest continues (each resume gets the whole time)")
    run.add_argument("--batch-size", type=positive_int, default=DEFAULTS["batch_size"], help="images per process per micro-batch")
    run.add_argument("--grad-accum", type=bounded_int(1, MAX_BATCHES_PER_STEP, "a stop is acted on between steps"),
                     default=DEFAULTS["grad_accum"], help="micro-batches per optimizer step")
    run.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default=DEFAULTS["mixed_precision"])
    run.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=DEFAULTS["channels_last"],
                     help="convolutions in channels-last memory format (on by default: 1.24-1.31x images/s for the "
                          "DCGANs on every CPU measured; --no-channels-last turns it off, see docs/benchmarks.md)")
    run.add_argument("--keep-freed-memory", action="store_true",
                     help="Linux/glibc: freed memory stays in the process, no page faults per step (see docs/benchmarks.md)")
    run.add_argument("--sample-every", type=positive_int, default=DEFAULTS["sample_every"], help="save a fixed-noise grid every N steps")
    run.add_argument("--keep-samples", type=positive_int, default=None, metavar="N",
                     help="keep the newest N step-stamped grids (and those progress.gif shows), prune older ones "
                          "(default: keep all)")
    run.add_argument("--gif-frames", type=positive_int, default=DEFAULTS["gif_frames"], metavar="N",
                     help="at most N frames in progress.gif, evenly spaced over the run (default 100)")
    run.add_argument("--log-every", type=positive_int, default=DEFAULTS["log_every"], help="metrics row every N steps")
    run.add_argument("--log-with", nargs="+", default=[], metavar="TRACKER", help=TRACKERS_HELP)
    run.add_argument("--tracker-project", default=None,
                     help="the trackers' project (experiment) name (default: the output folder's name)")
    run.add_argument("--seed", type=seed_int, default=DEFAULTS["seed"])
    run.add_argument("--resume", default=None, metavar="latest|auto|PATH",
                     help="continue the run in --output-dir ('latest'); 'auto': continue it if it has a checkpoint, "
                          "else start it (one command for a job that may be requeued); or start a new run in an "
                          "empty --output-dir from a checkpoint folder (PATH)")
    run.add_argument("--checkpoint-every", type=positive_int, default=DEFAULTS["checkpoint_every"], help="checkpoint every N steps (and at the end)")
    run.add_argument("--keep-checkpoints", type=positive_int, default=DEFAULTS["keep_checkpoints"], help="how many recent checkpoints to keep")
    run.add_argument("--max-bad-updates", type=positive_int, default=DEFAULTS["max_bad_updates"],
                     help="stop after this many consecutive skipped non-finite updates of one network (may change "
                          "on resume: a larger value goes on past a run of bad batches)")
    run.add_argument("--eval-every", type=positive_int, default=None,
                     help="also score --eval-samples samples every N steps (logged as eval/*), keeping the best "
                          "checkpoint by Frechet distance (named in best.json)")
    run.add_argument("--eval-samples", type=positive_int, default=2000, help="samples per --eval-every evaluation")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--collective-timeout", type=positive_float, default=DEFAULTS["collective_timeout"],
                     metavar="SECONDS",
                     help="with several processes: the longest a process waits for another in a collective "
                          "before the run stops, naming the one that did not answer (stopped, hung or dead)")
    return run


def add_model_flags(parser: argparse.ArgumentParser, width: int | None, z_dim: int | None, r1_gamma: float | None,
                    width_help: str = "DCGAN channel width (64 is the paper's)",
                    r1_help: str = "lazy R1 penalty on D's real images, every 16 D steps; 0 disables",
                    z_help: str | None = None) -> argparse._ArgumentGroup:
    """The "model and optimisation" group: sizes, rates, loss, n-critic, EMA, R1, spectral norm, schedule."""
    model = parser.add_argument_group("model and optimisation")
    model.add_argument("--width", type=bounded_int(1, 1024, "G's widest layer has many times as many channels"),
                       default=width, help=width_help)
    model.add_argument("--z-dim", type=bounded_int(1, 65536), default=z_dim, help=z_help)
    model.add_argument("--lr-g", type=positive_float, default=DEFAULTS["lr_g"])
    model.add_argument("--lr-d", type=positive_float, default=DEFAULTS["lr_d"])
    model.add_argument("--beta1", type=fraction, default=DEFAULTS["beta1"])
    model.add_argument("--beta2", type=fraction, default=DEFAULTS["beta2"])
    model.add_argument("--loss", default=DEFAULTS["loss"], help=loss_names())
    model.add_argument("--n-critic", type=positive_int, default=DEFAULTS["n_critic"], help="D updates per G update")
    model.add_argument("--ema-decay", type=fraction, default=DEFAULTS["ema_decay"],
                       help="EMA of G for samples (decay per step); 0 disables")
    model.add_argument("--ema-half-life", type=positive_float, default=None,
                       help="EMA half-life in training images instead of --ema-decay (StyleGAN2)")
    model.add_argument("--ema-rampup", type=positive_float, default=None,
                       help="with --ema-half-life: cap it at this times the images seen (StyleGAN2: 0.05)")
    model.add_argument("--ema-batchnorm", choices=("copy", "recompute"), default=DEFAULTS["ema_batchnorm"],
                       help="the EMA's BatchNorm statistics: G's, or measured for the EMA's weights")
    model.add_argument("--r1-gamma", type=nonnegative_float, default=r1_gamma, help=r1_help)
    model.add_argument("--r2-gamma", type=nonnegative_float, default=None,
                       help="R2 penalty on G's samples, taken with R1 (R3GAN's pair: the same gamma); 0 disables")
    model.add_argument("--r1-every", type=positive_int, default=DEFAULTS["r1_every"],
                       help="the penalties run every N-th D step, their loss times N (1: every step)")
    model.add_argument("--spectral-norm", action="store_true", help="spectral normalisation in D (no BatchNorm)")
    model.add_argument("--warmup-ratio", type=fraction, default=DEFAULTS["warmup_ratio"])
    model.add_argument("--lr-schedule", choices=("linear", "constant"), default=DEFAULTS["lr_schedule"])
    return model


def add_position_flag(group: argparse._ArgumentGroup) -> None:
    """``--d-position``: how the dcgan family's D sees where things sit, besides its convs (default: the
    family's own, coords for a conditional D)."""
    group.add_argument("--d-position", choices=POSITIONS, default=None,
                       help="dcgan family: how D sees where things sit besides its convs: coordinate channels, a "
                            "read of the centre of mass, that and the rows' and columns' ink profiles (not for a "
                            "conditional D), or not at all (default: coords for a conditional D, else none)")


def add_conditional_flags(group: argparse._ArgumentGroup,
                          label_distribution: str | None = DEFAULTS["label_distribution"],
                          class_weight: float | None = DEFAULTS["class_weight"]) -> None:
    """The class-conditional flags: G's label distribution and the auxiliary class loss."""
    group.add_argument("--label-distribution", choices=("uniform", "data"), default=label_distribution,
                       help="G's labels: the real batch's labels (data), or uniform over the classes")
    group.add_argument("--class-weight", type=nonnegative_float, default=class_weight,
                       help="weight of the auxiliary class loss (D classifies real images, G is pulled to its asked "
                            "class); 0 disables")


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the user typed, and only those (the parser's record of the flags given), for
    :func:`gan_accel.settle.settle`."""
    known = {*DEFAULTS, "epochs", "images"}
    return {name: getattr(args, name) for name in getattr(args, "flags_given", ()) if name in known}
