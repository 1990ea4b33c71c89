"""How the exporter sets up Python's cyclic garbage collector for a long-running poll loop.

Nearly everything the exporter allocates per poll is freed by reference counting (no cycles:
tests/test_gctune.py checks a poll, a fast poll, an indicator step and a render leave none).  The
cyclic collector still walks every young container object each time 700 more are alive than
were freed, and a poll cycle keeps thousands alive for a moment (readings, series dicts, the
indicators' output), so with the default thresholds it ran several times a second and a full
pass over every device's long-lived state (compiled mapping plans, counters, indicator windows)
ran every few seconds: at 128 GPUs that was about 30 % of the exporter's CPU (bench/run.py).

``after_load``: what is loaded for good (modules, schema, mappings, config) leaves the
collector's generations, and the young generation is collected every ``GEN0`` net allocations.
``after_warmup``: once every source has polled and the first exposition is rendered, the
per-device state built by then leaves the generations too.  Objects frozen there are still freed
by reference counting when dropped; only a cycle among them would never be collected, and the
exporter builds none.
"""

from __future__ import annotations

import gc

GEN0 = 50_000   # net container allocations between young-generation passes (Python's default: 700)
GEN1 = 20       # young passes per middle-generation pass (default 10)
GEN2 = 100      # middle passes before a full pass is considered (default 10)


_tuned = False  # after_load ran (the CLI's process); an embedding process (tests) is left alone


def after_load() -> None:
    global _tuned
    # the young generations hold what the load left unreachable (a handful of objects): 0.2 ms,
    # where a full pass over the ~55,000 loaded objects costs 30-40 ms of start-up
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
    _tuned = True


def after_warmup() -> None:
    if _tuned:
        gc.freeze()
