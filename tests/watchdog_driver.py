"""One process of a two-process gloo launch, for tests/test_watchdog.py (the test starts both itself).

    python tests/watchdog_driver.py tiny OUT [--steps N] [--timeout T] [--step-sleep S] [--sleep-at RANK:STEP:SECONDS]
    python tests/watchdog_driver.py example OUT -- <examples/dcgan_mnist.py flags>

``tiny``: the tests' tiny float64 GAN through ``run_script``, every rank writing the step it finished to
``OUT/step.rank<r>``; ``--step-sleep`` paces the steps so a test can act mid-training;
``--sleep-at 0:3:10``: process 0 alone sleeps 10 s at the end of step 3, before the next collective
(main-only work while the other waits). Each rank writes gloo's collective timeout to
``OUT/pg_timeout.rank<r>``. ``example``: examples/dcgan_mnist.py, as launched by a user.
"""

import argparse
import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

mode, out = sys.argv[1], Path(sys.argv[2])
if mode == "example":
    example = ROOT / "examples" / "dcgan_mnist.py"
    sys.argv = [str(example), *sys.argv[sys.argv.index("--") + 1:]]
    runpy.run_path(str(example), run_name="__main__")
    raise SystemExit(0)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--timeout", type=float, default=120.0)
parser.add_argument("--checkpoint-every", type=int, default=5)
parser.add_argument("--step-sleep", type=float, default=0.05)
parser.add_argument("--sleep-at", default=None)
args = parser.parse_args(sys.argv[3:])

from conftest import TableLatents, make_images, make_loader, make_models  # noqa: E402
from gan_accel import Callback, GANTrainer, TrainConfig  # noqa: E402
from gan_accel.scripts import run_script  # noqa: E402


class Pace(Callback):
    def on_step_end(self, trainer):
        rank = trainer.accelerator.process_index
        (out / f"step.rank{rank}").write_text(str(trainer.step))
        time.sleep(args.step_sleep)
        if args.sleep_at:
            who, step, seconds = args.sleep_at.split(":")
            if rank == int(who) and trainer.step == int(step):
                time.sleep(float(seconds))


def body() -> int:
    G, D = make_models()
    config = TrainConfig(max_steps=args.steps, batch_size=4, z_dim=4, log_every=1, sample_every=100_000,
                         num_samples=4, checkpoint_every=args.checkpoint_every, keep_checkpoints=2,
                         output_dir=str(out / "run"), progress_bar=False, collective_timeout=args.timeout)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), config, latent_sampler=TableLatents(1 << 17))
    trainer.callbacks.add(Pace(), before="signals")
    import torch
    import torch.distributed as dist

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    (out / f"pg_timeout.rank{trainer.accelerator.process_index}").write_text(str(backend.options._timeout))
    trainer.fit()
    return 0


sys.exit(run_script(body))
