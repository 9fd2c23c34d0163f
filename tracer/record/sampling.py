"""Per-step sampling of prompts: N samples per step per process, groups kept whole.

Each sample (prompt) of a step gets a score ``u`` from a seeded hash of
``(seed, step, validate, sample_index)``. A step records the N samples with
the smallest scores among those seen, a bottom-N choice that does not depend
on arrival order and is reproducible from the seed. While a step is still
admitting samples, an arriving sample with a smaller score displaces the
largest; the displaced sample's spans are still in memory (the writer holds a
step's spans until the step is decided) and are discarded. A step is decided
when no sample was admitted for ``decide_after_s`` seconds, when a later step
starts, or on :func:`tracer.flush`; after that, late samples are admitted only
while fewer than N are in.

Samples that are not chosen cost one hash at the start of each rollout: their
decorated calls pass straight through.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

PENDING = "pending"
IN = "in"
OUT = "out"

#: Buckets (step, validate) remembered before the oldest is forgotten.
MAX_BUCKETS = 64


def sample_score(seed: int, step: Any, validate: Any, sample_index: Any) -> float:
    """Seeded, order-independent score of a sample in [0, 1)."""
    digest = hashlib.blake2b(f"{seed}\x1f{step}\x1f{bool(validate)}\x1f{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class Sample:
    """One prompt's sampling state, shared by its rollouts' trajectories."""

    __slots__ = ("key", "score", "state", "trajectories")

    def __init__(self, key: Any, score: float, state: str) -> None:
        self.key = key
        self.score = score
        self.state = state
        self.trajectories: list[Any] = []


class _Bucket:
    __slots__ = ("admitted", "excluded", "decided", "last_admit")

    def __init__(self) -> None:
        self.admitted: dict[Any, Sample] = {}
        self.excluded: set[Any] = set()
        self.decided = False
        self.last_admit = time.monotonic()


class StepSampler:
    """Chooses which samples of each step are recorded.

    Args:
        limit: Samples per (step, validate) to record.
        seed: Seed of the scores.
        decide_after_s: Quiet time after which a step's choice is final.
    """

    def __init__(self, limit: int, seed: int, decide_after_s: float) -> None:
        self.limit = limit
        self.seed = seed
        self.decide_after_s = decide_after_s
        # Reentrant: a signal handler that starts a trajectory runs on the
        # thread it interrupted, which may hold this lock.
        self._lock = threading.RLock()
        self._buckets: dict[tuple[Any, bool], _Bucket] = {}
        #: Samples displaced after admission (their spans are discarded).
        self.displaced = 0

    def admit(self, step: Any, validate: Any, sample_index: Any) -> Sample | None:
        """Return the sample's state if it is (so far) chosen, else None."""
        bkey = (step, bool(validate))
        with self._lock:
            bucket = self._buckets.get(bkey)
            if bucket is None:
                bucket = self._new_bucket(bkey)
            sample = bucket.admitted.get(sample_index)
            if sample is not None:
                return sample if sample.state != OUT else None
            if sample_index in bucket.excluded:
                return None
            score = sample_score(self.seed, step, validate, sample_index)
            if len(bucket.admitted) < self.limit:
                sample = Sample(sample_index, score, IN if bucket.decided else PENDING)
            elif bucket.decided:
                bucket.excluded.add(sample_index)
                return None
            else:
                worst = max(bucket.admitted.values(), key=lambda s: s.score)
                if score >= worst.score:
                    bucket.excluded.add(sample_index)
                    return None
                del bucket.admitted[worst.key]
                bucket.excluded.add(worst.key)
                worst.state = OUT
                for traj in worst.trajectories:
                    traj.recording = False
                self.displaced += 1
                sample = Sample(sample_index, score, PENDING)
            bucket.admitted[sample_index] = sample
            bucket.last_admit = time.monotonic()
            return sample

    def _new_bucket(self, bkey: tuple[Any, bool]) -> _Bucket:
        bucket = _Bucket()
        step = bkey[0]
        # A later step starting means the earlier ones are done (RL steps run
        # in order); decide them now rather than after the quiet time.
        if isinstance(step, int):
            for (other_step, _), other in self._buckets.items():
                if isinstance(other_step, int) and other_step < step:
                    self._decide(other)
        self._buckets[bkey] = bucket
        if len(self._buckets) > MAX_BUCKETS:
            oldest = next(iter(self._buckets))
            self._decide(self._buckets.pop(oldest))
        return bucket

    def decide(self, force: bool = False) -> None:
        """Make final the choice of every step quiet for ``decide_after_s`` (all if ``force``)."""
        now = time.monotonic()
        with self._lock:
            for bucket in self._buckets.values():
                if not bucket.decided and (force or now - bucket.last_admit >= self.decide_after_s):
                    self._decide(bucket)

    @staticmethod
    def _decide(bucket: _Bucket) -> None:
        bucket.decided = True
        for sample in bucket.admitted.values():
            if sample.state == PENDING:
                sample.state = IN
