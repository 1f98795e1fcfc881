"""Runs examples/dcgan_mnist.py with a fault injected at a chosen step (used by test_crash.py).

    python tests/crash_driver.py MODE STEP -- <example flags>

MODE: kill-train   SIGKILL right after the metrics row of STEP is written (a crash mid-training)
      kill-save    SIGKILL while the checkpoint of STEP is being written (state on disk, not yet complete)
      sigterm      send SIGTERM to itself during STEP (graceful stop at the end of STEP expected)
"""

import os
import runpy
import signal
import sys
from pathlib import Path

import gan_accel.ending as signals
import gan_accel.engine.trainer as engine
import gan_accel.storage.checkpoint as checkpoint

mode, step = sys.argv[1], int(sys.argv[2])
example_args = sys.argv[sys.argv.index("--") + 1 :]

if mode == "kill-train":
    original_log = engine.GANTrainer.log_metrics

    def faulty_log(self):
        row = original_log(self)
        if self.step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return row

    engine.GANTrainer.log_metrics = faulty_log
elif mode == "sigterm":
    original_check = signals.SignalHandler.on_step_end

    def signal_then_check(self, trainer):
        if trainer.step == step:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives during step STEP; noticed at its end
        original_check(self, trainer)

    signals.SignalHandler.on_step_end = signal_then_check
elif mode == "kill-save":
    original_write = checkpoint._write_synced

    def faulty_write(path, text):
        if path.name == checkpoint.COMPLETE and path.parent.name.endswith(f"{step:08d}"):
            os.kill(os.getpid(), signal.SIGKILL)  # everything but the COMPLETE marker is on disk
        original_write(path, text)

    checkpoint._write_synced = faulty_write
else:
    raise SystemExit(f"unknown mode {mode}")

example = Path(__file__).resolve().parents[1] / "examples" / "dcgan_mnist.py"
sys.argv = [str(example), *example_args]
runpy.run_path(str(example), run_name="__main__")
