"""How the ranks of a trial agree on its outcome without hanging: through the rendezvous store.

A rank that fails classifies its exception and records it under the next number of a counter
in the store; the first record is the trial's outcome on every rank. The others learn of it
either because their own collective breaks (the failed rank leaves the process group) or from
a watcher thread that polls the store and, if the main thread stays blocked in a collective
(NCCL does not notice a peer that left), ends the process after writing what it knows.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sweeper.results.trial import FAILED, KERNEL_UNAVAILABLE, OOM
from sweeper.runtime.kernels import KernelUnavailable

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")
FIRST = "failure/1"


@dataclass(frozen=True)
class Failure:
    status: str
    error: str
    rank: int


def classify(exc: BaseException, *, rank: int) -> Failure:
    """oom, kernel_unavailable or failed, with a one-paragraph message naming the rank."""
    text = " ".join(str(exc).split())
    if isinstance(exc, KernelUnavailable):
        return Failure(KERNEL_UNAVAILABLE, text, rank)
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or any(m in text.lower() for m in OOM_MARKERS):
        return Failure(OOM, f"rank {rank}: {type(exc).__name__}: {text[:1000]}", rank)
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return Failure(FAILED, f"rank {rank}: {type(exc).__name__}: {text[:1000]}{at}", rank)


class Agreement:
    """The trial's outcome as recorded in the store (keys under a prefix private to this trial)."""

    def __init__(self, store: dist.Store, *, rank: int) -> None:
        # torchrun's agent keeps its store across restarts: one namespace per attempt
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.store = dist.PrefixStore(f"outcome/{attempt}", store)
        self.rank = rank

    def report(self, failure: Failure) -> None:
        """Record a failure; the counter orders reports so that the root cause is number 1."""
        n = self.store.add("count", 1)
        self.store.set(f"failure/{n}", json.dumps(failure.__dict__))

    def first(self) -> Failure | None:
        """The first recorded failure, or None while nobody failed."""
        if not self.store.check([FIRST]):
            return None
        return Failure(**json.loads(self.store.get(FIRST)))

    def acknowledge(self) -> None:
        """This rank has its outcome (and wrote it): rank 0 may take the store down once all have."""
        self.store.add("seen", 1)

    def wait_all_seen(self, world: int, *, timeout_s: float) -> bool:
        """On rank 0, which serves the store: keep it up until every rank acknowledged, or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.store.add("seen", 0) < world:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def resolve(self, exc: BaseException) -> Failure:
        """This rank failed with `exc`: unless another rank failed first (the cause), report it."""
        mine = classify(exc, rank=self.rank)
        try:
            if self.store.check([FIRST]):
                return self.first() or mine
            self.report(mine)
            return Failure(**json.loads(self.store.get(FIRST)))  # waits for number 1's record
        except RuntimeError:  # DistStoreError included
            return mine  # the store is gone (rank 0 left): this rank's own view is all there is


class Watcher:
    """A daemon thread that polls the store for a failure. If one is recorded and the main thread
    has not finished `grace_s` later (it is blocked in a collective that will never complete),
    it calls `on_stuck(failure)` to write the outcome, acknowledges it, and ends the process.
    Losing the store (rank 0 died) is treated the same way, as a failure.
    """

    def __init__(
        self,
        store: dist.Store,
        *,
        rank: int,
        on_stuck: Callable[[Failure], None],
        poll_s: float = 0.25,
        grace_s: float = 1.0,
    ) -> None:
        self.agreement = Agreement(store, rank=rank)
        self.rank = rank
        self.on_stuck, self.poll_s, self.grace_s = on_stuck, poll_s, grace_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trial-outcome-watcher", daemon=True)

    def start(self) -> Watcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=2 * self.poll_s + 1)

    def _run(self) -> None:
        while not self.done.wait(self.poll_s):
            try:
                failure = self.agreement.first()
            except RuntimeError:  # DistStoreError included
                failure = Failure(
                    FAILED, f"rank {self.rank}: lost the rendezvous store (rank 0 ended without an outcome)", self.rank
                )
            if failure is None:
                continue
            if self.done.wait(self.grace_s):
                return  # the main thread noticed by itself
            self.on_stuck(failure)
            try:
                self.agreement.acknowledge()
            except RuntimeError:
                pass
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
