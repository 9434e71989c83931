"""Hang diagnosis (issue 9): what the runtime's gangs are waiting for.

* `diagnose()`: on demand, every gang that is enqueued but not running, with
  its program, node, client and devices, how long it has waited, and what it
  waits for: admission (proportional share), devices whose queues another
  gang heads (named, with whether it runs), inputs not ready (named, with the
  gang that produces them).
* The hang watchdog: a gang that has not started `hang_report_seconds` (a
  topology key, default 60; 0 turns it off) after its submission is reported
  once, as a `HangWarning`. The runtime's watchdog thread never calls Python:
  its reports are queued, and issued by the next wait on the runtime (or the
  one under way: waits look every 50 ms) in the waiting thread.
"""

from __future__ import annotations

import warnings
from typing import Iterable

from pathways import _core

__all__ = ["diagnose", "Diagnosis", "HangWarning"]


class Diagnosis(list):
    """What the runtime waits for: one dict per waiting gang, longest wait first.

    A gang waits when it is enqueued but not running. Each dict has:

    - `program`, `node` (the compiled function), `client`: its names;
    - `island`, `id` (its submission number on the island), `devices` (ids);
    - `state`: "waiting_for_admission" (not in the island's order yet, under
      proportional share), "queued" (another gang heads one of its devices'
      queues) or "holding_devices" (it heads all its queues, and waits for
      inputs);
    - `waited_seconds`: since it was submitted;
    - `waiting_for`: a list of "admission", "devices" and "inputs";
    - `blocked_by`: the gangs heading the queues of its devices, each a dict
      of `program`, `node`, `client`, `island`, `id`, `state`, `running`,
      and `devices` (which of this gang's devices it heads);
    - `inputs`: its inputs not ready, each with `index`, `type` (like
      "f32[2,4]"), `devices`, `copy` (whether it is being copied from another
      slice) and `producer` (the gang in flight that produces it, as in
      `blocked_by`, or None).

    Attributes:
      islands: Per island, a dict of `island`, `running`, `queued` (in flight
        and not running) and `waiting_for_admission`.

    `str()` gives a readable report.
    """

    def __init__(self, gangs: Iterable[dict] = (), islands: Iterable[dict] = (), text: str = ""):
        super().__init__(gangs)
        self.islands = list(islands)
        self._text = text

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Diagnosis({list.__repr__(self)}, islands={self.islands!r})"


class HangWarning(RuntimeWarning):
    """A gang has not started `hang_report_seconds` after its submission.

    Issued once per gang, by a wait on the runtime in the waiting thread.
    `diagnosis` holds the reported gangs (a `Diagnosis`). Silence it with
    `warnings.simplefilter("ignore", pw.HangWarning)`, or turn a hang into an
    exception with `warnings.simplefilter("error", pw.HangWarning)` (or
    `python -W error::pathways.HangWarning`): the wait then raises it.
    """

    def __init__(self, message: str, diagnosis: Diagnosis):
        super().__init__(message)
        self.diagnosis = diagnosis


def diagnose() -> Diagnosis:
    """Reports every gang that is enqueued but not running, and what it waits for.

    Example:
      >>> print(pw.diagnose())
      pathways: 1 gang waiting to start. island 0: 1 running, 1 queued; island 1: idle
      - 'step' of program 'train', client 'default' (island 0, gang #7) on island 0 devices [0,1], waiting 4.2 s: queued behind other gangs
          devices [0,1]: queue headed by 'slow' of program 'eval', client 'default' (island 0, gang #6), running

    Starts the runtime if needed. Takes each island's scheduler lock once,
    briefly; safe to call from any thread, at any time.

    Returns:
      A `Diagnosis`: a list of dicts, one per waiting gang, with per-island
      counts in `.islands` and a readable `str()`.
    """
    return Diagnosis(*_core.diagnose())


def _warn_hang(report: tuple, threshold_seconds: float) -> None:
    """Issues a watchdog report (called by the core in a waiting thread)."""
    diagnosis = Diagnosis(*report)
    n = len(diagnosis)
    message = (
        f"{n} {'gang has' if n == 1 else 'gangs have'} not started {threshold_seconds:g} s after submission "
        f"(hang_report_seconds); pw.diagnose() shows what waits now.\n{diagnosis}"
    )
    # Level 2: the caller of the runtime's wait (level 1 is this function).
    warnings.warn(HangWarning(message, diagnosis), stacklevel=2)
