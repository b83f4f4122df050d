"""Whether a worker takes the jobs Celery hands it now, and how many it is taking.

A multi-model worker's model going to sleep closes it: a message popped from then on goes back to
the queue unclaimed, and the sleep waits until every job let in before has ended or been handed
back (a job let in may not have claimed yet: it is not among the runner's attempts until it has).
"""

from __future__ import annotations

import threading


class Admission:
    def __init__(self) -> None:
        self.open = True
        self.held = 0  # jobs let in and not returned yet (run, passed on, or skipped)
        self._cond = threading.Condition()

    def enter(self) -> bool:
        """Let a job in (from a Celery thread): False while closed."""
        with self._cond:
            if not self.open:
                return False
            self.held += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self.held -= 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.open = False

    def reopen(self) -> None:
        with self._cond:
            self.open = True

    def wait_empty(self, timeout: float | None) -> bool:
        """Wait until no job let in is still held; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.held == 0, timeout)
