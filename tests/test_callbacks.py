"""Callbacks: the documented event order, replacing and switching off built-ins, state in checkpoints,
a failing callback that stops the run with its name while the last checkpoint stays intact, the one
surface through which callbacks change the run (``trainer.control``), and the built-ins' names."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import Z_DIM, TableLatents, make_images, make_loader, make_models, params, reset_accelerate_state
from gan_accel import Callback, CallbackError, GANTrainer, TrainConfig, TrainingInterrupted, list_checkpoints
from gan_accel.callbacks import BUILTIN_CALLBACKS, CallbackList
from gan_accel.callbacks.metrics_log import read_metrics


def trainer_for(tmp_path, callbacks=(), disable=(), **overrides) -> GANTrainer:
    cfg = dict(max_steps=4, batch_size=4, z_dim=Z_DIM, log_every=2, sample_every=2, checkpoint_every=2,
               num_samples=4, output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    G, D = make_models()
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), TrainConfig(**cfg), latent_sampler=latents,
                         callbacks=callbacks, disable_callbacks=disable)
    latents.rewind()
    return trainer


class Recorder(Callback):
    """Records every event with the step it came at."""

    def __init__(self):
        self.events = []

    def on_fit_start(self, trainer):
        self.events.append(("fit_start", trainer.step))

    def on_phase_end(self, trainer, phase):
        self.events.append((f"phase:{phase.name}", trainer.step))

    def on_step_end(self, trainer):
        self.events.append(("step_end", trainer.step))

    def on_log(self, trainer, row):
        self.events.append(("log", row["step"]))

    def on_sample(self, trainer):
        self.events.append(("sample", trainer.step))

    def on_checkpoint(self, trainer):
        self.events.append(("checkpoint", trainer.step))

    def on_fit_end(self, trainer):
        self.events.append(("fit_end", trainer.step))

    def on_close(self, trainer):
        self.events.append(("close", trainer.step))


def test_events_fire_in_the_documented_order(tmp_path):
    recorder = Recorder()
    trainer_for(tmp_path, callbacks=[recorder], max_steps=3, log_every=2, sample_every=3, checkpoint_every=2).fit()
    step = lambda s: [("phase:D", s), ("phase:G", s), ("step_end", s + 1)]  # noqa: E731
    assert recorder.events == [
        ("fit_start", 0),
        *step(0),
        *step(1), ("log", 2), ("checkpoint", 2),
        *step(2), ("log", 3), ("sample", 3),  # the last step is always logged and sampled
        ("checkpoint", 3), ("fit_end", 3), ("close", 3),
    ]


def test_builtins_come_first_in_their_fixed_order_and_yours_after(tmp_path):
    recorder = Recorder()
    # log_with adds the trackers callback (a missing tracker package is only a warning: nothing starts before fit)
    trainer = trainer_for(tmp_path, callbacks=[recorder], ema_decay=0.9, progress_bar=True, log_with=("tensorboard",))
    assert trainer.callbacks.names == [*BUILTIN_CALLBACKS, "recorder"]


def test_a_callback_named_like_a_builtin_replaces_it_and_disable_switches_builtins_off(tmp_path):
    class TensorSamples(Callback):
        name = "sample_saver"

        def on_sample(self, trainer):
            torch.save(trainer.generate(), trainer.output_dir / f"mine_{trainer.step}.pt")

    trainer = trainer_for(tmp_path, callbacks=[TensorSamples()], disable=("weights_exporter", "checkpointer"))
    assert "weights_exporter" not in trainer.callbacks.names and "checkpointer" not in trainer.callbacks.names
    names = trainer.callbacks.names
    assert names == [name for name in BUILTIN_CALLBACKS if name in names]  # "sample_saver" in the built-in's place
    trainer.fit()
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("mine_*.pt")) == ["mine_2.pt", "mine_4.pt"]
    assert not list(run.glob("samples_*.png")) and not (run / "generator").exists()
    assert not (run / "checkpoints").exists()


def test_unknown_builtin_name_in_disable_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"disable_callbacks=\['sampels'\]: built-in callbacks are"):
        trainer_for(tmp_path, disable=("sampels",))


def test_a_raising_callback_stops_the_run_with_its_name_and_the_last_checkpoint_is_intact(tmp_path):
    class Exploding(Callback):
        name = "my_probe"

        def on_step_end(self, trainer):
            if trainer.step == 3:
                raise RuntimeError("probe went wrong")

    trainer = trainer_for(tmp_path, callbacks=[Exploding()])
    with pytest.raises(CallbackError) as info:
        trainer.fit()
    message = str(info.value)
    assert "callback 'my_probe' (Exploding) failed in on_step_end at step 3: RuntimeError: probe went wrong" in message
    assert "checkpoint_00000002" in message and "--resume latest" in message
    # The checkpoint of step 2 is complete and resumable; nothing partial was left behind.
    run = tmp_path / "run"
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint_00000002"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint_00000002"]
    reset_accelerate_state()
    resumed = trainer_for(tmp_path)
    resumed.fit(resume_from="latest")
    assert resumed.step == 4 and [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [2, 4]


def test_close_runs_after_an_error_and_restores_the_signal_handlers(tmp_path):
    import signal

    recorder = Recorder()

    class Failing(Callback):
        def on_sample(self, trainer):
            raise ValueError("bad sample")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(CallbackError, match="failed in on_sample at step 2"):
        trainer_for(tmp_path, callbacks=[recorder, Failing()]).fit()
    assert recorder.events[-1] == ("close", 2)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stateful_callback_is_checkpointed_and_restored(tmp_path):
    class Counter(Callback):
        def __init__(self):
            self.seen = 0

        def on_step_end(self, trainer):
            self.seen += 1

        def state_dict(self):
            return {"seen": self.seen}

        def load_state_dict(self, state):
            self.seen = state["seen"]

    trainer_for(tmp_path, callbacks=[Counter()]).fit(stop_at_step=2)
    reset_accelerate_state()
    counter = Counter()
    trainer_for(tmp_path, callbacks=[counter]).fit(resume_from="latest")
    assert counter.seen == 4  # 2 restored + 2 new


def test_a_checkpoint_without_a_callbacks_state_is_refused_with_the_reason(tmp_path):
    from gan_accel import CheckpointError

    trainer_for(tmp_path, ema_decay=0.9).fit(stop_at_step=2)
    reset_accelerate_state()
    # Same config, the EMA callback switched off: the checkpoint's EMA state has nowhere to go.
    with pytest.raises(CheckpointError, match=r"callbacks \['generator_ema', 'health_monitor'\] but this run has \['health_monitor'\]"):
        trainer_for(tmp_path, disable=("generator_ema",), ema_decay=0.9).fit(resume_from="latest")
    reset_accelerate_state()
    # A changed ema_decay is caught before anything is loaded, as a config change that cannot happen.
    with pytest.raises(CheckpointError, match=r"ema_decay: 0.9 -> None"):
        trainer_for(tmp_path).fit(resume_from="latest")


def test_callback_list_add_before_after_replace_remove():
    class A(Callback):
        pass

    class B(Callback):
        pass

    class C(Callback):
        pass

    callbacks = CallbackList([A(), C()])
    callbacks.add(B(), before="c")
    assert callbacks.names == ["a", "b", "c"]
    with pytest.raises(ValueError, match="already registered"):
        callbacks.add(B())
    removed = callbacks.remove("a")
    assert isinstance(removed, A) and callbacks.names == ["b", "c"]
    callbacks.add(A(), after="b")
    assert callbacks.names == ["b", "a", "c"]
    with pytest.raises(KeyError, match="no callback named 'z'"):
        callbacks.remove("z")


def test_ema_is_a_callback_and_samples_come_from_it(tmp_path):
    trainer = trainer_for(tmp_path, ema_decay=0.5, max_steps=3)
    trainer.fit()
    ema = trainer.callbacks.get("generator_ema").ema
    assert trainer.sampling_generator() is ema.module
    assert ema.num_updates == 3
    # The average differs from G itself (it lags behind).
    assert any(not torch.equal(a, b) for a, b in zip(params(ema.module).values(), params(trainer.G).values()))


# -- what a callback may change: only through trainer.control ----------------------------------------------
class AsksTheRun(Callback):
    """Uses every request of trainer.control once, at the steps given."""

    def __init__(self, out):
        self.out = out
        self.seen_checkpoint_steps = []

    def on_step_end(self, trainer):
        if trainer.step == 1:
            trainer.control.log({"mine/value": 7.0})
            trainer.control.save_checkpoint()  # a checkpoint at step 1, where the interval would give none
            trainer.control.keep_checkpoint("checkpoint_00000001")
        if trainer.step == 3:
            trainer.control.stop(15)

    def on_checkpoint(self, trainer):
        # a checkpoint the writer reported earlier in the same event is already in the state
        self.seen_checkpoint_steps.append(trainer.state.last_checkpoint_step)
        if trainer.accelerator.is_main_process and trainer.step == 1:
            (self.out / "mine.txt").write_text("written by a callback")


def test_a_callback_changes_the_run_through_control_and_the_trainer_applies_it(tmp_path):
    out = tmp_path / "run"
    asks = AsksTheRun(out)
    trainer = trainer_for(tmp_path, callbacks=[asks], max_steps=6, log_every=1, checkpoint_every=2,
                          keep_checkpoints=1)
    with pytest.raises(TrainingInterrupted, match="stopped by SIGTERM at step 3"):
        trainer.fit()
    rows = read_metrics(out / "metrics.jsonl")
    assert [row.get("mine/value") for row in rows] == [7.0, None, None]  # in the next row only
    # step 1 was checkpointed on request and kept from pruning (keep_checkpoints=1); 3 by the stop
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint_00000001", "checkpoint_00000003"]
    assert trainer.state.kept_checkpoints == {"checkpoint_00000001"}
    assert asks.seen_checkpoint_steps[:1] == [1] and trainer.state.last_checkpoint_step == 3
    assert (out / "mine.txt").read_text() == "written by a callback"


def test_no_built_in_callback_sets_a_field_of_the_trainer():
    """Built-ins change the run only through ``trainer.control``: no ``trainer.<field> = ...``, and no call
    that changes what the trainer holds (its run folder, sets or dicts) behind the trainer's back."""
    import ast
    from pathlib import Path

    import gan_accel.callbacks as package

    mutating = {"add", "discard", "update", "record", "sync_checkpoints", "setdefault", "pop", "append", "clear"}
    found = []
    for path in sorted(Path(package.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) and _root(target) == "trainer":
                    found.append(f"{path.name}:{node.lineno} sets {ast.unparse(target)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in mutating \
                    and _root(node.func) == "trainer" and ast.unparse(node.func).split(".")[1] != "control":
                found.append(f"{path.name}:{node.lineno} calls {ast.unparse(node.func)}")
    assert found == []


def _root(node) -> str | None:
    import ast

    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


# -- names ---------------------------------------------------------------------------------------------
def test_every_built_in_callback_is_named_after_its_class():
    from gan_accel.callbacks import BUILTIN_CLASSES
    from gan_accel.callbacks.base import snake_case

    assert [cls.name for cls in BUILTIN_CLASSES] == [snake_case(cls.__name__) for cls in BUILTIN_CLASSES]
    import ast
    import inspect

    for cls in BUILTIN_CLASSES:  # derived, never written by hand in the class body of a Callback
        if not issubclass(cls, Callback):  # gan_accel.ending's handler sits below the callbacks' layer
            continue
        body = ast.parse(inspect.getsource(cls)).body[0].body
        assert not [n for n in body if isinstance(n, ast.Assign) and "name" in map(ast.unparse, n.targets)], cls
    assert list(BUILTIN_CALLBACKS) == ["generator_ema", "metrics_logger", "health_monitor", "tracker_logger",
                                       "progress_bar", "sample_saver", "training_plot", "checkpointer",
                                       "weights_exporter", "signal_handler"]
    assert [snake_case(n) for n in ("SampleSaver", "GeneratorEMA", "EMACallback", "HTTPServer2X")] == \
        ["sample_saver", "generator_ema", "ema_callback", "http_server2_x"]
