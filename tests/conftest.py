import os

pytest_plugins = [
    "tests.support.pg",
    "tests.support.gcp_fake",
    "tests.support.moto",
    "tests.support.aws_calls",
    "tests.support.aws_stub",
]

# Mark, then sweep (docs/SAFETY.md rule 23) waits one interval before a delete cycle deletes an
# orphan it found. The tests written before it delete in the first delete cycle: the window is 0
# for them, and for every process they start (the CLI, the functions). The tests of rule 23
# (tests/integration/test_mark_then_sweep.py, the simulation, the demo) set their own window;
# settings built with ``Settings.explicit`` ignore the environment and say ``confirm_seconds``.
os.environ.setdefault("ORPHAN_CLEANUP_CONFIRM_SECONDS", "0")
