"""The spinning pool's shared state and its worker threads, with no compiler in sight.

hetflow's spinning pool (``hetflow.devices.cpu.spin_pool``) and a compiled package's runtime
(``hetflow_lite.session``) run the same compiled claiming loop: the caller announces a job in a small
``int64`` array (the layout below) and claims its chunks beside workers that spin on that array. What
differs is how the loop is reached: through numba there, through a shared library and ``ctypes`` here.
The worker threads' lifecycle (start on first use, spin while a run is active and for a grace after it,
then sleep until the next run wakes them) is the same in both, and lives here once.
"""

from __future__ import annotations

import threading

import numpy as np

# Slots of the shared state (int64), each on its own cache line.
WORD = 0  # (sequence << SEQUENCE_SHIFT) | the chunks claimed from the back and from the front
DONE = 8  # chunks of the current job finished
JOB = 16  # the current job's function address
ARGS = 24  # the current job's argument block address
CHUNKS = 32  # the current job's chunk count
SPIN = 40  # nonzero while a run is active: workers spin without a limit
STOP = 48  # nonzero: workers return
STATE_SLOTS = 56

# The job word: chunks claimed from the front (low bits), from the back, and the job's sequence number.
BACK_SHIFT = 20
SEQUENCE_SHIFT = 40
CHUNK_MASK = (1 << BACK_SHIFT) - 1
#: The most chunks one job may have.
MAX_CHUNKS = CHUNK_MASK

#: Pause-hinted spin iterations a worker keeps spinning after the last run ended (~0.3 ms on the Zen 4
#: VM: 20,000 pauses alone took 0.23 ms), so that back-to-back runs find it awake.
GRACE_SPINS = 20_000


class SpinningThreads:
    """``workers`` threads that serve the jobs announced in ``state`` (started on first use).

    A subclass says how a worker serves: ``serve(seen)`` runs the compiled loop that takes chunks of every
    new job until no run has been active for ``grace`` spins, and returns the last sequence it saw.
    """

    def __init__(self, workers: int, grace: int = GRACE_SPINS):
        self.workers = workers
        self.grace = grace
        self.state = np.zeros(STATE_SLOTS, dtype=np.int64)
        self._busy = threading.Lock()  # one job (or replayed script) at a time
        self._wake = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._active_runs = 0
        self._sleeping = 0  # workers waiting on ``_wake``

    def serve(self, seen: int) -> int:
        raise NotImplementedError

    def spin(self) -> None:
        """A run starts: wake the workers and keep them spinning until ``rest``."""
        with self._wake:
            self._active_runs += 1
            self.state[SPIN] = 1
            if self._sleeping:  # back-to-back runs find the workers still spinning: nothing to wake
                self._wake.notify_all()

    def rest(self) -> None:
        """A run ended: once no run is active, the workers spin ``grace`` more, then sleep."""
        with self._wake:
            self._active_runs -= 1
            if self._active_runs == 0:
                self.state[SPIN] = 0

    def close(self) -> None:
        """Stop the workers (a later run starts them again)."""
        with self._wake:
            self.state[STOP] = 1
            self._wake.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads = []
        self.state[STOP] = 0

    def start(self) -> None:
        """Start the workers that are not running (a run calls it before it announces its first job)."""
        if len(self._threads) < self.workers:
            with self._wake:
                while len(self._threads) < self.workers:
                    thread = threading.Thread(target=self._worker, name="hetflow-spin", daemon=True)
                    thread.start()
                    self._threads.append(thread)

    def _worker(self) -> None:
        seen = int(self.state[WORD]) >> SEQUENCE_SHIFT
        while True:
            seen = self.serve(seen)
            with self._wake:
                while not self.state[SPIN] and not self.state[STOP]:
                    self._sleeping += 1
                    self._wake.wait()
                    self._sleeping -= 1
                if self.state[STOP]:
                    return
