"""Train a DCGAN on MNIST with gan_accel.

    python examples/dcgan_mnist.py                       # one process (CPU or one GPU)
    accelerate launch examples/dcgan_mnist.py            # same flags, as many processes as configured
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 examples/dcgan_mnist.py

The defaults are sized for a 2-core CPU (a few minutes, recognisable digits); see docs/index.md for
the full-size GPU settings. Outputs land in --output-dir: samples_<step>.png, samples_final.png,
progress.gif, metrics.jsonl, config.json, generator.safetensors and, with --eval, eval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from gan_accel import GANTrainer, TrainConfig, build_accelerator
from gan_accel.data import make_dataloader, resolve_dataset
from gan_accel.engine.launch import describe_launch
from gan_accel.models import ConditionalDCGANGenerator, DCGANDiscriminator, DCGANGenerator, ProjectionDiscriminator
from gan_accel.scripts import (ArgumentParser, bounded_int, fraction, nonnegative_float, positive_float,
                               positive_int, run_script, seed_int)


# (conditional) chosen by measurement to finish within 8 minutes on 2 CPU cores (docs/benchmarks.md: the ablation)
DEFAULT_STEPS = {False: 5000, True: 4000}
DEFAULT_R1_GAMMA = {False: 0.1, True: 0.0}


def parse_args(argv: list[str] | None = None, conditional: bool = False) -> argparse.Namespace:
    """The flags of this script; ``conditional`` adds those of ``conditional_mnist.py``."""
    kind = "a class-conditional DCGAN" if conditional else "a DCGAN"
    parser = ArgumentParser(
        description=f"Train {kind} on MNIST with gan_accel (works under `accelerate launch` with the same flags).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = parser.add_argument_group("data")
    data.add_argument("--data-dir", default=os.environ.get("GAN_ACCEL_DATA_DIR", "./data"),
                      help="where MNIST is looked for and downloaded (env GAN_ACCEL_DATA_DIR)")
    data.add_argument("--dataset", choices=("auto", "mnist", "digits"), default="auto",
                      help="auto: MNIST, else the built-in offline digits with a message; mnist: MNIST or exit; "
                           "digits: the offline digit set")
    run = parser.add_argument_group("run")
    run.add_argument("--output-dir", default="runs/conditional_mnist" if conditional else "runs/dcgan_mnist",
                     help="run folder for samples, logs and weights")
    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int, default=None,
                        help=f"generator optimizer steps (default {DEFAULT_STEPS[conditional]})")
    length.add_argument("--epochs", type=positive_float, default=None, help="train for this many passes over the data instead")
    run.add_argument("--batch-size", type=positive_int, default=64, help="images per process per micro-batch")
    run.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    run.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default="no")
    run.add_argument("--channels-last", action="store_true",
                     help="convolutions in channels-last memory format (1.2-1.4x images/s on the 2-core CPUs here)")
    run.add_argument("--keep-freed-memory", action="store_true",
                     help="Linux/glibc: freed memory stays in the process, no page faults per step (see docs/benchmarks.md)")
    run.add_argument("--sample-every", type=positive_int, default=500, help="save a fixed-noise grid every N steps")
    run.add_argument("--keep-samples", type=positive_int, default=None, metavar="N",
                     help="keep the newest N step-stamped grids (and those progress.gif shows), prune older ones "
                          "(default: keep all)")
    run.add_argument("--gif-frames", type=positive_int, default=100, metavar="N",
                     help="at most N frames in progress.gif, evenly spaced over the run (default 100)")
    run.add_argument("--log-every", type=positive_int, default=50, help="metrics row every N steps")
    run.add_argument("--log-with", nargs="+", default=[], metavar="TRACKER",
                     help="also log metrics and sample grids to these trackers through Accelerate (space or comma "
                          "separated): tensorboard, wandb, mlflow, trackio, aim, comet_ml, clearml, dvclive, swanlab, "
                          "or all (the installed ones); TensorBoard writes to <output-dir>/trackers/<project>")
    run.add_argument("--tracker-project", default=None,
                     help="the trackers' project (experiment) name (default: the output folder's name)")
    run.add_argument("--seed", type=seed_int, default=0)
    run.add_argument("--resume", default=None, metavar="latest|PATH",
                     help="continue a run from its newest checkpoint ('latest') or from a checkpoint folder")
    run.add_argument("--overwrite", action="store_true",
                     help="replace a previous run in --output-dir (removes only the files that run wrote)")
    run.add_argument("--fork", action="store_true",
                     help="with --resume PATH of another run folder: start a new run in --output-dir from it")
    run.add_argument("--checkpoint-every", type=positive_int, default=1000, help="checkpoint every N steps (and at the end)")
    run.add_argument("--keep-checkpoints", type=positive_int, default=2, help="how many recent checkpoints to keep")
    run.add_argument("--max-bad-updates", type=positive_int, default=10,
                     help="stop after this many consecutive skipped non-finite updates of one network (may change "
                          "on resume: a larger value goes on past a run of bad batches)")
    run.add_argument("--eval", action="store_true", help="after training, score --num-eval samples with an MNIST classifier")
    run.add_argument("--num-eval", type=positive_int, default=10_000,
                     help="samples --eval scores at the end (a conditional run: this many over all classes)")
    run.add_argument("--eval-every", type=positive_int, default=None,
                     help="also score --eval-samples samples every N steps (logged as eval/*), keeping the best "
                          "checkpoint by Frechet distance (named in best.json)")
    run.add_argument("--eval-samples", type=positive_int, default=2000, help="samples per --eval-every evaluation")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--collective-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                     help="with several processes: stop every process, naming the one, when a process has not "
                          "answered for this long (stopped, dead or unreachable; a busy one always answers)")
    model = parser.add_argument_group("model and optimisation")
    model.add_argument("--width", type=bounded_int(1, 1024, "G's widest layer has 4x as many channels"), default=32,
                       help="DCGAN channel width (64 is the paper's)")
    model.add_argument("--z-dim", type=bounded_int(1, 65536), default=100)
    model.add_argument("--lr-g", type=positive_float, default=1e-3)
    model.add_argument("--lr-d", type=positive_float, default=1e-3)
    model.add_argument("--beta1", type=fraction, default=0.5)
    model.add_argument("--loss", default="nonsaturating", help="nonsaturating, hinge, wasserstein or least_squares")
    model.add_argument("--n-critic", type=positive_int, default=1, help="D updates per G update")
    model.add_argument("--ema-decay", type=fraction, default=0.99, help="EMA of G for samples (decay per step); 0 disables")
    model.add_argument("--ema-half-life", type=positive_float, default=None,
                       help="EMA half-life in training images instead of --ema-decay (StyleGAN2)")
    model.add_argument("--ema-rampup", type=positive_float, default=None,
                       help="with --ema-half-life: cap it at this times the images seen (StyleGAN2: 0.05)")
    model.add_argument("--ema-batchnorm", choices=("copy", "recompute"), default="copy",
                       help="the EMA's BatchNorm statistics: G's, or measured for the EMA's weights")
    model.add_argument("--r1-gamma", type=nonnegative_float, default=DEFAULT_R1_GAMMA[conditional],
                       help="lazy R1 penalty on D's real images, every 16 D steps; 0 disables")
    model.add_argument("--spectral-norm", action="store_true", help="spectral normalisation in D (no BatchNorm)")
    model.add_argument("--warmup-ratio", type=fraction, default=0.05)
    model.add_argument("--lr-schedule", choices=("linear", "constant"), default="constant")
    if conditional:
        model.add_argument("--label-distribution", choices=("uniform", "data"), default="data",
                           help="G's labels: the real batch's labels (data), or uniform over digits")
        model.add_argument("--class-weight", type=nonnegative_float, default=1.0,
                           help="weight of the auxiliary class loss (D classifies real digits, G is pulled to "
                                "its asked digit); 0 disables")
        model.add_argument("--d-position", choices=("coords", "moments", "none"), default="coords",
                           help="how D sees where strokes are: coordinate channels, spatial moments, or not at "
                                "all (then G drew the ones off-centre)")
    args = parser.parse_args(argv)
    args.conditional = conditional
    if args.fork and args.resume is None:
        parser.error("--fork needs --resume PATH: the checkpoint of another run to start this one from")
    return args


def steps_for(args: argparse.Namespace, batches_per_epoch: int) -> int:
    if args.steps is not None:
        return args.steps
    if args.epochs is not None:
        return max(1, int(args.epochs * batches_per_epoch) // (args.grad_accum * args.n_critic))
    return DEFAULT_STEPS[args.conditional]


def main(argv: list[str] | None = None, conditional: bool = False) -> int:
    args = parse_args(argv, conditional)
    return run_script(lambda: train(args), debug=args.debug)


def train(args: argparse.Namespace) -> int:
    # The config is validated first, so a bad flag fails before any data or model work.
    config = TrainConfig(
        max_steps=args.steps or 1, batch_size=args.batch_size, grad_accum_steps=args.grad_accum,
        n_critic=args.n_critic, loss=args.loss, z_dim=args.z_dim, lr_G=args.lr_g, lr_D=args.lr_d,
        betas_G=(args.beta1, 0.999), betas_D=(args.beta1, 0.999), lr_schedule=args.lr_schedule,
        warmup_ratio=args.warmup_ratio,
        ema_decay=None if args.ema_half_life else args.ema_decay or None, ema_half_life=args.ema_half_life,
        ema_rampup=args.ema_rampup, ema_batchnorm=args.ema_batchnorm, r1_gamma=args.r1_gamma or None, mixed_precision=args.mixed_precision,
        channels_last=args.channels_last, keep_freed_memory=args.keep_freed_memory,
        sample_every=args.sample_every, keep_samples=args.keep_samples, gif_frames=args.gif_frames,
        log_every=args.log_every, output_dir=args.output_dir, seed=args.seed,
        log_with=tuple(name.strip() for names in args.log_with for name in names.split(",") if name.strip()),
        tracker_project=args.tracker_project,
        progress_bar=not args.no_progress, overwrite=args.overwrite, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints, collective_timeout=args.collective_timeout,
        max_bad_updates=args.max_bad_updates,
        num_classes=10 if args.conditional else None, num_samples=100 if args.conditional else 64,
        label_distribution=getattr(args, "label_distribution", "uniform"),
        class_loss_weight=getattr(args, "class_weight", 0.0),
    )
    accelerator = build_accelerator(config)
    dataset = resolve_dataset(args.dataset, args.data_dir, accelerator=accelerator, log=accelerator.print)
    loader = make_dataloader(dataset.images, dataset.labels, args.batch_size, shuffle=True, drop_last=True)
    config.max_steps = steps_for(args, len(loader) // accelerator.num_processes)
    model = {"z_dim": args.z_dim, "width": args.width, "image_size": 28, "channels": 1}
    if args.spectral_norm:
        model.update(spectral_norm=True)
    if args.conditional:
        model.update(conditional=True, num_classes=10, spectral_norm=args.spectral_norm)
        if args.d_position != "none":  # unrecorded for "none": runs from before the flag resume with --d-position none
            model.update(d_position=args.d_position)
    config.model = model  # what gan-accel sample rebuilds G from; fixed on resume
    config.extra = {"dataset": dataset.name, "data_source": dataset.source, "num_processes": accelerator.num_processes}
    config.validate()

    torch.manual_seed(args.seed)  # the same initial weights on every process (DDP also broadcasts them)
    if args.conditional:  # G(z, y) and a projection D(x, y); the loader's labels reach both
        G = ConditionalDCGANGenerator(10, z_dim=args.z_dim, width=args.width, image_size=28)
        D = ProjectionDiscriminator(10, width=args.width, image_size=28, spectral_norm=args.spectral_norm,
                                    position=args.d_position)
    else:
        G = DCGANGenerator(z_dim=args.z_dim, width=args.width, image_size=28)
        D = DCGANDiscriminator(width=args.width, image_size=28, spectral_norm=args.spectral_norm)
    callbacks = [mnist_evaluator(args, dataset, accelerator)] if args.eval_every else []
    trainer = GANTrainer(G, D, loader, config, accelerator=accelerator, callbacks=callbacks)
    accelerator.print(
        f"gan_accel: {dataset.name} ({len(dataset.images)} images from {dataset.source}); {config.max_steps} steps of "
        f"{args.batch_size} x {args.grad_accum} images per process; {describe_launch(accelerator)}; output in "
        f"{config.output_dir}"
    )
    metrics = trainer.fit(resume_from=args.resume, fork=args.fork)
    # One line per process, so a multi-process launch shows that every rank trained its share.
    print(f"process {accelerator.process_index}/{accelerator.num_processes}: {trainer.step} steps, "
          f"{trainer.images_seen} images in batches of {args.batch_size}", flush=True)
    accelerator.print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))

    if args.eval and accelerator.is_main_process:
        from gan_accel.eval.mnist import evaluate_conditional_generator, evaluate_generator

        score = evaluate_conditional_generator if args.conditional else evaluate_generator
        size = {"per_class": max(1, args.num_eval // 10)} if args.conditional else {"num_samples": args.num_eval}
        result = score(trainer.sampling_generator(), args.data_dir, z_dim=args.z_dim, device=accelerator.device,
                       fallback=dataset, **size)
        (Path(config.output_dir) / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        trainer.run_folder.record(Path(config.output_dir) / "eval.json", trainer.step)
        accelerator.print(result["summary"])
    accelerator.wait_for_everyone()
    return 0


def mnist_evaluator(args: argparse.Namespace, dataset, accelerator):
    """Evaluation during training in the MNIST classifier's features, against held-out digits."""
    from gan_accel.callbacks import Evaluator
    from gan_accel.eval import compute_features
    from gan_accel.eval.mnist import cache_dir, load_or_train_classifier, reference_digits
    from gan_accel.data.loader import uint8_to_float

    name, (train_x, train_y), (held_x, _) = reference_digits(args.data_dir, fallback=dataset)
    classifier = load_or_train_classifier(cache_dir() / f"{name}_classifier.safetensors", train_x, train_y)
    classifier.to(accelerator.device)
    reference = compute_features(classifier.features, uint8_to_float(held_x[:10_000]))
    return Evaluator(classifier.features, reference, every=args.eval_every, num_samples=args.eval_samples,
                     metric="fd", logits=classifier)


if __name__ == "__main__":
    sys.exit(main())
