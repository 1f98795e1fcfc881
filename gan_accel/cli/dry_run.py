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

from ..settle import DataFacts, SettledRun, setting, settle, spec_overrides
from .forecast import say_run_time, throwaway_models
from .train import check_steering, default_resolution, settle_run
from .train_flags import given_settings

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

    before = {name: getattr(args, name) for name in RUN_RECORDS}
    recorded, recorded_data, family = settle_run(args)
    # what settle_run filled in: from the resumed run's records, else the built-in crop and background
    sources = {name: "resume" if name not in ("crop", "background") or (recorded_data or {}).get(name) else "default"
               for name in RUN_RECORDS if before[name] is None and getattr(args, name) is not None}
    processes = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    log = processes.print
    log("gan_accel: dry run: the run as it would start; nothing is written")
    given = given_settings(args)
    batch_size = setting("batch_size", given, recorded)
    chosen, prep = peek_data(args, family, processes, sources, log, batch_size)
    count, classes = chosen.report.count, len(chosen.class_names or [])
    held = held_out_count(count, batch_size * processes.num_processes) if recorded_data is None else \
        len(recorded_data.get("held_out") or [])  # a resume keeps the slice its run held out
    facts = DataFacts(prep.resolution, count, prep.channels, classes if args.conditional else None,
                      trained=count - held)
    run = settle(given, facts, gpu=processes.device.type == "cuda", processes=processes.num_processes,
                 recorded=recorded, defaults={"output_dir": args.output_dir})
    check_steering(run.config, held)
    for note in run.notes:
        log(note)
    timed = args  # "auto" on a folder without a run starts one: timed as a new run
    if args.resume == AUTO and recorded_data is None and resolve_auto(args.output_dir) is None:
        timed = argparse.Namespace(**{**vars(args), "resume": None})
    class_text = f", {classes} classes" if args.conditional else ""
    data = (f"{chosen.report.summary()} (headers read, nothing decoded) -> {prep.resolution} px, {prep.channels} "
            f"channel(s){class_text}")
    for line in describe(args, data, run, {**sources, **run.sources}):
        log(line)
    say_run_time(timed, run.spec, spec_overrides(given, run.spec["family"]), run.config,
                 on_cpu=processes.device.type == "cpu", log=log, always=True)
    return 0


def peek_data(args: argparse.Namespace, family: str | None, processes: Any, sources: dict[str, str],
              log: Callable[[str], Any], batch_size: int) -> tuple[Any, Any]:
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
                                  batch_size=batch_size)
    if args.channels is None:
        args.channels, sources["channels"] = prep.channels, "data"
    return chosen, prep


def report(args: argparse.Namespace, run: SettledRun, data: str, on_cpu: bool, log: Callable[[str], Any]) -> int:
    """The dry run of a script that settles its run without reading the images' headers (the examples): the data
    (``data``, said by the script), the model, every setting with its source, the expected time; returns 0."""
    log("gan_accel: dry run: the run as it would start; nothing is written")
    for line in [*run.notes, *describe(args, data, run, run.sources)]:
        log(line)
    say_run_time(args, run.spec, {}, run.config, on_cpu=on_cpu, log=log, always=True)
    return 0


def describe(args: argparse.Namespace, data: str, run: SettledRun, sources: dict[str, str]) -> list[str]:
    """The dry run's lines: the data (``data``, said by the caller), the model, then every flag's value (the settled
    run's for a setting, else the command's) with its source (``sources``, by destination; a command flag given is
    ``flag``, else ``default``)."""
    spec = run.spec
    G, D = throwaway_models(spec)
    lines = [f"data: {data}",
             f"model: {spec['family']} at {spec['image_size']} px, width {spec['width']}, z {spec['z_dim']}: "
             f"G {count_parameters(G):,} parameters, D {count_parameters(D):,}",
             "settings (source: flag = given, recipe = the recipe's row, resume = the run's record, data = chosen "
             "from the images, default = built in):"]
    names = getattr(args, "option_names", {})
    given = set(getattr(args, "flags_given", ()))
    values = {**vars(args), **{name: value for name, value in run.settings.items() if name in names}}
    unset = []
    for name, value in sorted(values.items(), key=lambda item: names.get(item[0], item[0])):
        if name in NOT_SETTINGS or name not in names:  # not a flag: what the script set itself
            continue
        if value is None:
            unset.append(names[name])
            continue
        source = sources.get(name) or ("flag" if name in given else "default")
        lines.append(f"  {names[name]:<24} {show(value):<24} {source}")
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
