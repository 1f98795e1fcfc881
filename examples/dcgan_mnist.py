"""Train a DCGAN on MNIST with gan_accel.

    python examples/dcgan_mnist.py                       # one process (CPU or one GPU)
    accelerate launch examples/dcgan_mnist.py            # same flags, as many processes as configured
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 examples/dcgan_mnist.py

The defaults are sized for a 2-core CPU (a few minutes, recognisable digits); see docs/index.md for
the full-size GPU settings. Outputs land in --output-dir: samples_<step>.png, samples_final.png,
progress.gif, metrics.jsonl, config.json, generator/ and, with --eval, eval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from gan_accel import DataFacts, GANTrainer, SettledRun, build_accelerator, settle
from gan_accel.settle import setting
from gan_accel.data import make_dataloader, resolve_dataset
from gan_accel.engine.launch import describe_launch
from gan_accel.models import build_models
from gan_accel.cli.train_flags import (add_conditional_flags, add_model_flags, add_position_flag, add_run_flags,
                                       given_settings)
from gan_accel.cli.arguments import ArgumentParser, positive_int
from gan_accel.ending import run_script

# MNIST and the offline digits alike: 60,000 grey 28-px digits of 10 classes, known before they are loaded.
MNIST = {"side": 28, "count": 60_000, "channels": 1}
# This script's own defaults, which win over the recipe's row for 28-px images (the rest of the run is the row's).
# The lengths and the batch were chosen by measurement (docs/benchmarks.md: the ablation): the unconditional run
# takes about 13 minutes on 2 CPU cores; the conditional run keeps the loss and Adam it was measured with.
SCRIPT_DEFAULTS = {
    # D reads where and how big each digit is drawn ("profiles") and sees 384 digits a step: MNIST centres every
    # digit by its mass in a 20-pixel box, and the reader's precision follows that and the batch: 0.68 / 0.67 at
    # 128, 0.71 / 0.71 at 384 on seeds 0 / 1, for three times the time (docs/benchmarks.md).
    False: {"steps": 5000, "output_dir": "runs/dcgan_mnist", "d_position": "profiles", "batch_size": 384},
    True: {"steps": 4000, "output_dir": "runs/conditional_mnist", "loss": "nonsaturating", "lr_g": 1e-3,
           "lr_d": 1e-3, "beta2": 0.999, "num_samples": 100},  # samples: a row of 10 per digit
}


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
    run = add_run_flags(parser, None, SCRIPT_DEFAULTS[conditional]["steps"])
    run.add_argument("--dry-run", action="store_true",
                     help="print the run as it would start (the data, the model and its parameters, every setting "
                          "with where it came from, the expected time) and exit: nothing is downloaded or written")
    run.add_argument("--eval", action="store_true", help="after training, score --num-eval samples with an MNIST classifier")
    run.add_argument("--num-eval", type=positive_int, default=10_000,
                     help="samples --eval scores at the end (a conditional run: this many over all classes)")
    model = add_model_flags(parser, width=None, z_dim=None, r1_gamma=None)
    if conditional:
        add_conditional_flags(model)
    add_position_flag(model)
    # --help shows what a run given no flags uses (settle reads only the flags given)
    flags = {action.dest for action in parser._actions}
    parser.set_defaults(**{name: value for name, value in settle_mnist({}, conditional).settings.items()
                           if name in flags and name != "steps"})
    parser.remember_given_flags()  # settle and --dry-run read the settings given as such
    args = parser.parse_args(argv)
    args.conditional = conditional
    return args


def main(argv: list[str] | None = None, conditional: bool = False) -> int:
    args = parse_args(argv, conditional)
    return run_script(lambda: train(args), debug=args.debug)


def settle_mnist(given: dict, conditional: bool, processes: int = 1, gpu: bool = False,
                 resume: str | None = None) -> SettledRun:
    """The run, settled as `gan-accel train` settles one (the flags given, the resumed run's own settings, this
    script's defaults, the recipe's row)."""
    data = DataFacts(**MNIST, classes=10 if conditional else None)
    defaults, recorded = SCRIPT_DEFAULTS[conditional], None
    if resume is not None:
        from gan_accel.cli.train import check_run_folder

        # The run this one continues keeps the settings it recorded for the flags left out, as in gan-accel train.
        folder = setting("output_dir", given, defaults=defaults)
        recorded, _ = check_run_folder(argparse.Namespace(output_dir=folder, resume=resume))
    return settle(given, data, gpu=gpu, processes=processes, recorded=recorded, defaults=defaults)


def train(args: argparse.Namespace) -> int:
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    # Settled first, so a bad flag fails before any data or model work; the Accelerator comes on these processes.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    run = settle_mnist(given_settings(args), args.conditional, state.num_processes, state.device.type == "cuda",
                       args.resume)
    config = run.config
    if args.dry_run:
        return dry_run(args, run, state)
    accelerator = build_accelerator(config)
    dataset = resolve_dataset(args.dataset, args.data_dir, accelerator=accelerator, log=accelerator.print)
    loader = make_dataloader(dataset.images, dataset.labels, config.batch_size, shuffle=True, drop_last=True)
    config.extra = {"dataset": dataset.name, "data_source": dataset.source, "num_processes": accelerator.num_processes}

    torch.manual_seed(config.seed)  # the same initial weights on every process (DDP also broadcasts them)
    G, D = build_models(run.spec)  # conditional: G(z, y) and a projection D(x, y); the loader's labels reach both
    callbacks = [mnist_evaluator(args, dataset, accelerator)] if args.eval_every else []
    trainer = GANTrainer(G, D, loader, config, accelerator=accelerator, callbacks=callbacks)
    accelerator.print(
        f"gan_accel: {dataset.name} ({len(dataset.images)} images from {dataset.source}); {config.max_steps} steps of "
        f"{config.batch_size} x {config.grad_accum_steps} images per process; {describe_launch(accelerator)}; output "
        f"in {config.output_dir}"
    )
    for note in run.notes:  # the recipe line: what the run uses, and where each setting came from
        accelerator.print(note)
    metrics = trainer.fit(resume_from=args.resume)
    # One line per process, so a multi-process launch shows that every rank trained its share.
    print(f"process {accelerator.process_index}/{accelerator.num_processes}: {trainer.step} steps, "
          f"{trainer.images_seen} images in batches of {config.batch_size}", flush=True)
    accelerator.print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))

    if args.eval and accelerator.is_main_process:
        from gan_accel.eval.mnist import evaluate_conditional_generator, evaluate_generator

        score = evaluate_conditional_generator if args.conditional else evaluate_generator
        size = {"per_class": max(1, args.num_eval // 10)} if args.conditional else {"num_samples": args.num_eval}
        result = score(trainer.sampling_generator(), args.data_dir, z_dim=config.z_dim, device=accelerator.device,
                       fallback=dataset, **size)
        (Path(config.output_dir) / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        accelerator.print(result["summary"])
    accelerator.wait_for_everyone()
    return 0


def dry_run(args: argparse.Namespace, run: SettledRun, state) -> int:
    """--dry-run: the run as it would start, printed; MNIST is read when it is there, never downloaded (else the
    offline digits, said in one line), and nothing is written."""
    from gan_accel.cli.dry_run import report

    dataset = resolve_dataset(args.dataset, args.data_dir, download=False, log=state.print)
    data = f"{dataset.name}, {len(dataset.images):,} images from {dataset.source}"
    return report(args, run, data, on_cpu=state.device.type == "cpu", log=state.print)


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
