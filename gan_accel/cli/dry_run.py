"""``gan-accel train ... --dry-run``: the run as it would start, printed, and nothing written.

The run is settled by the same steps as a real one (:mod:`gan_accel.cli.train`): the run folder looked at
(read-only), the images listed and their headers read, the recipe's row, the model, the config. What differs is
only what writes: the scan of the images is read from the cache when it is there and made in memory when it is
not, no image is decoded (a file that fails to decode is found by the real run), no run folder, lock or cache file
is made, and the expected time is measured on throwaway networks (:mod:`gan_accel.cli.forecast`). A Hugging Face
dataset is still loaded through ``datasets``, which keeps its own download cache.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from ..recipes import default_recipe
from .forecast import say_run_time, throwaway_models
from .train import build_config, check_model, default_resolution, fill_from_recipe, settle_run

# The namespace's entries that are not settings: the command's plumbing, and what the dry run prints itself.
NOT_SETTINGS = {"run", "debug", "command", "flags_given", "given", "option_names", "dry_run", "data"}
RUN_RECORDS = ("model", "resolution", "channels", "crop", "background")  # what a resume takes from the run


def dry_run(args: argparse.Namespace) -> int:
    """Settle the run as :func:`gan_accel.cli.train.train` does, print it with where each setting came from, and
    return 0 without writing anything."""
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    from ..data.image_data import held_out_count
    from ..engine.run_open import AUTO, resolve_auto
    from ..models import default_spec

    given = set(getattr(args, "flags_given", ()))
    before = {name: getattr(args, name) for name in RUN_RECORDS}
    recorded_data, family = settle_run(args)
    sources = {name: source_of_record(name, recorded_data) for name in RUN_RECORDS
               if before[name] is None and getattr(args, name) is not None}
    sources["output_dir"] = "default"  # given, it is a flag (below)
    processes = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    log = processes.print
    log("gan_accel: dry run: the run as it would start; nothing is written")
    chosen, prep = peek_data(args, family, processes, sources, log)
    count = chosen.report.count
    classes = len(chosen.class_names or [])
    gpu = processes.device.type == "cuda"
    resolution = args.resolution
    recipe = default_recipe(resolution, count, gpu)
    if family is None:
        family, args.model, sources["model"] = recipe.model, recipe.model, "recipe"
    sources.update(dict.fromkeys(fill_from_recipe(args, recipe, family, log), "recipe"))
    overrides = check_model(args, family)
    spec = default_spec(family, resolution, prep.channels, classes if args.conditional else None, **overrides)
    for name in ("width", "z_dim", "d_position"):  # left out by flag and recipe: the family's own
        if getattr(args, name) is None and spec.get(name) is not None:
            setattr(args, name, spec[name])
            sources[name] = "default"
    held = held_out_count(count, args.batch_size * processes.num_processes) if recorded_data is None else \
        len(recorded_data.get("held_out") or [])  # a resume keeps the slice its run held out
    trained = count - held
    batches = trained // args.batch_size // processes.num_processes
    config = build_config(args, spec, batches, processes.num_processes, {}, recipe)
    if args.conditional:  # left out, the config's own (build_config)
        for name, value in (("label_distribution", config.label_distribution), ("class_weight", config.class_loss_weight)):
            if getattr(args, name) is None:
                setattr(args, name, value)
    timed = args  # "auto" on a folder without a run starts one: timed as a new run
    if args.resume == AUTO and recorded_data is None and resolve_auto(args.output_dir) is None:
        timed = argparse.Namespace(**{**vars(args), "resume": None})
    G, D = throwaway_models(spec)
    class_text = f", {classes} classes" if args.conditional else ""
    data = (f"{chosen.report.summary()} (headers read, nothing decoded) -> {prep.resolution} px, {prep.channels} "
            f"channel(s){class_text}")
    for line in describe(args, data, spec, G, D, config.max_steps, given, sources):
        log(line)
    say_run_time(timed, spec, overrides, config, on_cpu=processes.device.type == "cpu", log=log, always=True)
    return 0


def peek_data(args: argparse.Namespace, family: str | None, processes: Any, sources: dict[str, str],
              log: Callable[[str], Any]) -> tuple[Any, Any]:
    """The images the run would use and their preprocessing, from their headers alone (nothing decoded or
    written); the resolution and channels left out are chosen as :func:`~gan_accel.cli.train.open_data` does."""
    from ..data import Preprocessing, scan_images

    images = scan_images(args.data, "required" if args.conditional else "none", split=args.split,
                         image_column=args.image_column, label_column=args.label_column, cache_dir=args.cache_dir,
                         accelerator=processes, read_only=True)
    if args.resolution is None:
        args.resolution, why = default_resolution(family, images.sizes)
        sources["resolution"] = "data"
        if why:
            log(why)
    chosen, prep = images.preview(Preprocessing(args.resolution, args.channels, args.crop, args.background),
                                  batch_size=args.batch_size)
    if args.channels is None:
        args.channels, sources["channels"] = prep.channels, "data"
    return chosen, prep


def report(args: argparse.Namespace, config: Any, spec: dict[str, Any], data: str, on_cpu: bool,
           log: Callable[[str], Any]) -> int:
    """The dry run of a script whose settings are its flags (the examples): the data (``data``, said by the script),
    the model, every setting as given or the script's default, the expected time; returns 0."""
    G, D = throwaway_models(spec)
    log("gan_accel: dry run: the run as it would start; nothing is written")
    for line in describe(args, data, spec, G, D, config.max_steps, set(getattr(args, "flags_given", ())), {}):
        log(line)
    say_run_time(args, spec, {}, config, on_cpu=on_cpu, log=log, always=True)
    return 0


def source_of_record(name: str, recorded_data: dict[str, Any] | None) -> str:
    """Where a run-record setting settled before the data came from: the resumed run, else the built-in default."""
    if name in ("crop", "background"):
        return "resume" if (recorded_data or {}).get(name) else "default"
    return "resume"


def describe(args: argparse.Namespace, data: str, spec: dict[str, Any], G: Any, D: Any, steps: int, given: set[str],
             sources: dict[str, str]) -> list[str]:
    """The dry run's lines: the data (``data``, said by the caller), the model, then every setting with its source
    (``sources``: by destination, for those not given and not built-in defaults)."""
    lines = [f"data: {data}",
             f"model: {spec['family']} at {spec['image_size']} px, width {spec['width']}, z {spec['z_dim']}: "
             f"G {count_parameters(G):,} parameters, D {count_parameters(D):,}",
             "settings (source: flag = given, recipe = the recipe's row, resume = the run's record, data = chosen "
             "from the images, default = built in):"]
    names = getattr(args, "option_names", {})
    unset = []
    for name, value in sorted(vars(args).items(), key=lambda item: names.get(item[0], item[0])):
        if name in NOT_SETTINGS or name not in names:  # not a flag: what the script set itself
            continue
        flag = names[name]
        source = "flag" if name in given else sources.get(name, "default")
        if name == "steps" and value is None:
            value = steps  # from --epochs or --images
            source = "flag" if given & {"epochs", "images"} else source
        if value is None:
            unset.append(flag)
            continue
        lines.append(f"  {flag:<24} {show(value):<24} {source}")
    if unset:
        lines.append(f"not set (off, or the default their --help names): {', '.join(unset)}")
    return lines


def show(value: Any) -> str:
    """A setting's value as the command line writes it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "none"
    return str(value)


def count_parameters(module: Any) -> int:
    """The number of parameters of ``module`` (every tensor counted, trainable or not)."""
    return sum(p.numel() for p in module.parameters())

