"""``gan-accel ARGS`` that pauses at one stage, for tests/test_interruptions.py to send it a real signal there.

    python tests/stage_driver.py STAGE READY -- <gan-accel arguments>

STAGE: scan (listing the image folder), cache (the image cache's temporary array is written), train (after the
metrics row of step 2), checkpoint (a checkpoint's files are written, its COMPLETE marker not yet), export (the
export's weights are written into its temporary folder), eval (computing the real images' features), none (no
pause: the retry). There the process creates the file READY and waits (up to a minute) for the signal the test
sends, or for the file READY.go; a stage never reached lets the command go on as usual. With STAGE_RANK=R in the
environment only the process of that rank pauses (one process of a launch held at a stage, the others waiting).
"""

import os
import signal
import sys
import time
from pathlib import Path

stage, ready = sys.argv[1], Path(sys.argv[2])
go = ready.with_name(f"{ready.name}.go")  # created by the test: the paused process goes on
argv = sys.argv[sys.argv.index("--") + 1:]


def pause() -> None:
    """Say the stage is reached, then wait for the signal (sleep is where a real one lands); a signal that only
    asks the run to stop (training's handler) ends the wait too, so the run stops where the test expects."""
    if ready.exists() or os.environ.get("STAGE_RANK", os.environ.get("RANK")) != os.environ.get("RANK"):
        return  # once per run, on the rank asked
    got: list[int] = []
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def noted(signum, frame):
        got.append(signum)
        handler = handlers[signum]
        if callable(handler):
            handler(signum, frame)  # gan_accel's own handler: it raises, or sets its stop flag

    for signum in handlers:
        signal.signal(signum, noted)
    try:
        ready.write_text(str(os.getpid()))  # the process to signal, in a launch of several
        deadline = time.monotonic() + 60
        while not got and not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def after(module, name: str, when=lambda *a, **k: True) -> None:
    """``module.name`` runs, then pauses when ``when(*args)`` holds."""
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        if when(*args, **kwargs):
            pause()
        return result

    setattr(module, name, wrapped)


def before(module, name: str, when=lambda *a, **k: True) -> None:
    """``module.name`` pauses first when ``when(*args)`` holds, then runs."""
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        if when(*args, **kwargs):
            pause()
        return original(*args, **kwargs)

    setattr(module, name, wrapped)


if stage == "scan":
    import gan_accel.data.image_cache as image_cache

    before(image_cache, "scan")
elif stage == "cache":
    import gan_accel.data.image_cache as image_cache

    after(image_cache, "preallocate")  # the temporary array exists, its rows not yet decoded
elif stage == "train":
    import gan_accel.engine.trainer as engine

    after(engine.GANTrainer, "log_metrics", lambda self: self.step == 2)
elif stage == "checkpoint":
    import gan_accel.storage.checkpoint as checkpoint

    before(checkpoint, "_write_synced", lambda path, text: path.name == checkpoint.COMPLETE)
elif stage == "export":
    import gan_accel.hub.pretrained as pretrained

    after(pretrained, "save_generator")
elif stage == "eval":
    import gan_accel.eval as evaluation

    before(evaluation, "compute_features")
elif stage != "none":  # none: the command as it is (the retry)
    raise SystemExit(f"unknown stage {stage}")

from gan_accel.cli import main  # noqa: E402  (after the patches: modules bind what they import)

sys.exit(main(argv))
