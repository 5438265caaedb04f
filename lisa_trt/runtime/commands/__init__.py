"""The entry of each `lisa-trt` command: `entry(rc, **options)`, which `RunContext.run` calls.

    generate.py   generate                      calibrate.py  calibrate
    train.py      train                         export.py     export, build, plan, quantize-trt
    run.py        run                           checkpoints.py  convert, random-checkpoint
    (lisa_trt/harness.py `bench_command`: bench; runtime/demo.py `run_demo`: demo)

lisa_trt/cli/ parses the options and calls one of these; what differs between families comes
from the family's objects (models/family.py), asked here, never in the CLI.
"""
