"""The sections of ``benchmarks/gpu_check.py`` (the entry point: options, the section table, the driver).

- ``report``: Section, Report and the JSON/Markdown files;
- ``fixtures``: the Run, the proofs' settings, tiny models, data, latents, the trainer factory, comparisons;
- ``proofs``: accumulation, twin, resume;
- ``precision``: fp16, bf16, penalties, guard;
- ``device_features``: env, channels_last, compile, checkpoint, evaluator;
- ``speed``: engine_vs_plain, syncs, memory;
- ``commands``: the recipe's ``gan-accel train`` and the quickstart.

Its modules import ``engine_overhead`` and ``make_rgb_digits`` by bare name: ``benchmarks/`` is on sys.path
(``gpu_check.py`` puts it there).
"""
