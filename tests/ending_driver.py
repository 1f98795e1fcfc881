"""One process of a two-process gloo launch, for tests/test_ending.py (the test starts both itself).

    python tests/ending_driver.py OUT [--timeout T] [--checkpoint-every N]

A tiny run through ``run_script`` that never finishes by itself. Each rank writes its step to
``OUT/step.rank<r>`` after every step, and torch's collective timeout to ``OUT/pg_timeout.rank<r>``.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--timeout", type=float, default=120.0)
parser.add_argument("--checkpoint-every", type=int, default=5)
args = parser.parse_args()

from conftest import TableLatents, make_images, make_loader, make_models  # noqa: E402
from gan_accel import Callback, GANTrainer, TrainConfig  # noqa: E402
from gan_accel.ending import run_script  # noqa: E402


class Pace(Callback):
    def on_step_end(self, trainer):
        (args.out / f"step.rank{trainer.accelerator.process_index}").write_text(str(trainer.step))
        time.sleep(0.05 if trainer.step < 7 else 0.5)  # past step 7 (where the tests act), slowly: a waiting
        # launch shares the CPU with the module's other launches


def body() -> int:
    G, D = make_models()
    config = TrainConfig(max_steps=100_000, batch_size=4, z_dim=4, log_every=1, sample_every=100_000,
                         num_samples=4, checkpoint_every=args.checkpoint_every, keep_checkpoints=2,
                         output_dir=str(args.out / "run"), progress_bar=False, collective_timeout=args.timeout)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), config, latent_sampler=TableLatents(1 << 17))
    trainer.callbacks.add(Pace(), before="signal_handler")
    import torch
    import torch.distributed as dist

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    (args.out / f"pg_timeout.rank{trainer.accelerator.process_index}").write_text(str(backend.options._timeout))
    trainer.fit()
    return 0


sys.exit(run_script(body))
