"""Keeps the processes of ``meshserve up`` running: one that exits is restarted with backoff,
and one that keeps crashing is left down, while the rest of the mesh serves on.

``Restarts`` is the policy (pure, on an injected clock); ``Supervisor`` watches a ``Supervised``
group of processes (the launcher's ``Mesh``) and acts on it from threads of its own.
"""

from __future__ import annotations

import enum
import logging
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    """When a process of the mesh that exited is started again."""

    first_delay_s: float = 0.5
    """Wait before the first restart; each further one waits twice as long as the one before."""
    max_delay_s: float = 10.0
    """The longest wait before a restart."""
    reset_after_s: float = 30.0
    """A process that was ready this long before it exited counts as healthy: its restart waits
    ``first_delay_s`` again."""
    max_restarts: int = 5
    """Restarts allowed within ``window_s``; a process that needs one more is in a crash loop and
    is left down."""
    window_s: float = 60.0


class Restarts:
    """The restart history of each process and what the policy decides from it. No I/O: time
    comes from ``clock``."""

    def __init__(self, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._up_since: dict[str, float] = {}
        self._failures: dict[str, int] = {}             # restarts since it was last up for reset_after_s
        self._recent: dict[str, deque[float]] = {}      # when each restart within window_s was decided

    def up(self, name: str) -> None:
        """``name`` is ready: started, or back after a restart."""
        self._up_since[name] = self._clock()

    def exited(self, name: str) -> float | None:
        """``name`` exited: seconds to wait before starting it again, or None for a crash loop."""
        policy, now = self.policy, self._clock()
        up_since = self._up_since.pop(name, None)
        if up_since is not None and now - up_since >= policy.reset_after_s:
            self._failures[name] = 0
        recent = self._recent.setdefault(name, deque())
        while recent and now - recent[0] > policy.window_s:
            recent.popleft()
        if len(recent) >= policy.max_restarts:
            return None
        recent.append(now)
        failures = self._failures.get(name, 0)
        self._failures[name] = failures + 1
        return min(policy.first_delay_s * 2**failures, policy.max_delay_s)


def describe_exit(returncode: int) -> str:
    """``-9`` -> "killed by SIGKILL", ``3`` -> "exited with code 3" (Popen's convention)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class State(enum.Enum):
    RESTARTING = "restarting"   # waiting out its backoff, or started again and not ready yet
    DOWN = "down"               # given up on (a crash loop)


class Process(Protocol):
    """One supervised process: its name, its ``Popen`` and the log it writes."""

    @property
    def name(self) -> str: ...

    @property
    def popen(self) -> subprocess.Popen[bytes]: ...

    @property
    def log_path(self) -> Path: ...

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines this process wrote."""
        ...


P = TypeVar("P", bound=Process)


class Supervised(Protocol[P]):
    """What the supervisor supervises: processes it may kill, start again and wait for."""

    @property
    def procs(self) -> Sequence[P]:
        """The processes now running or given up on; a restarted one replaces its old entry."""
        ...

    def kill(self, proc: P) -> None:
        """Kills ``proc`` and every process it left behind."""
        ...

    def restart(self, name: str) -> P | None:
        """Starts process ``name`` again as it was first started; None once stopping."""
        ...

    def wait_ready(self, proc: P) -> None:
        """Blocks until ``proc`` is ready; raises if it exits first or time runs out."""
        ...


class Supervisor(Generic[P]):
    """Watches the processes of a started ``Mesh`` (``Supervised``) and restarts one that exits.

    One thread polls every process; each restart (its backoff, then the new process's readiness
    probe, which for vLLM takes tens of seconds) runs on a thread of its own, so a slow start
    never delays noticing another exit. A restarted process that exits before it is ready is
    one more exit for the policy. Its owner (the launcher's ``Mesh.stop()``) calls ``stop()``
    first (no restart begins after it), kills every process, then ``join()``s the restarts,
    which end with their process.
    """

    def __init__(self, mesh: Supervised[P], policy: RestartPolicy, poll_interval_s: float = 0.1) -> None:
        self._mesh = mesh
        self._restarts = Restarts(policy)
        self._poll_interval_s = poll_interval_s
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._state: dict[str, State] = {}              # processes not simply running
        self._threads: list[threading.Thread] = []
        self._watcher = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    @property
    def down(self) -> frozenset[str]:
        """The processes given up on."""
        with self._lock:
            return frozenset(name for name, state in self._state.items() if state is State.DOWN)

    def start(self) -> None:
        for proc in self._mesh.procs:
            self._restarts.up(proc.name)
        self._watcher.start()

    def stop(self) -> None:
        """Stops watching; a restart waiting out its backoff gives up at once."""
        self._stopping.set()
        if self._watcher.is_alive():
            self._watcher.join()

    def join(self, timeout_s: float) -> None:
        """Waits for the restarts in progress to end (they do once their process is gone)."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("%s did not end", thread.name)

    def _watch(self) -> None:
        while not self._stopping.wait(self._poll_interval_s):
            for proc in list(self._mesh.procs):
                with self._lock:
                    watched = proc.name not in self._state
                try:
                    if watched and proc.popen.poll() is not None:
                        self._exited(proc)
                except Exception:  # keep watching the others
                    log.exception("supervising %s failed", proc.name)

    def _exited(self, proc: P) -> None:
        self._mesh.kill(proc)  # what it left behind (vLLM's engine processes) goes with it
        why = f"{proc.name} (pid {proc.popen.pid}) {describe_exit(proc.popen.returncode)}"
        with self._lock:
            delay = self._restarts.exited(proc.name)
            self._state[proc.name] = State.DOWN if delay is None else State.RESTARTING
        if delay is None:
            policy = self._restarts.policy
            log.error("%s: a crash loop (%d restarts within %.0fs); leaving it down, the rest of the mesh "
                      "keeps serving. Its log %s ends:\n%s",
                      why, policy.max_restarts, policy.window_s, proc.log_path, proc.log_tail(15))
            return
        log.warning("%s; restarting it in %gs (log %s)", why, delay, proc.log_path)
        thread = threading.Thread(target=self._restart, args=(proc.name, delay), name=f"restart-{proc.name}",
                                  daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _restart(self, name: str, delay_s: float) -> None:
        try:
            if self._stopping.wait(delay_s):
                return
            proc = self._mesh.restart(name)
            if proc is None:  # the mesh is stopping
                return
            try:
                self._mesh.wait_ready(proc)
            except Exception as e:  # noqa: BLE001 - a failed start is an exit like any other
                # One that exited is the watcher's to report; one alive but not ready is killed.
                if proc.popen.poll() is None and not self._stopping.is_set():
                    log.warning("%s (pid %d) did not become ready (%s); killing it", name, proc.popen.pid,
                                str(e).splitlines()[0] if str(e) else type(e).__name__)
                    self._mesh.kill(proc)
                return
            with self._lock:
                self._restarts.up(name)
            log.info("%s is back (pid %d)", name, proc.popen.pid)
        finally:
            with self._lock:
                if self._state.get(name) is State.RESTARTING:
                    del self._state[name]
