"""Per-step sampling of prompts: N groups per step per process, groups kept whole (docs/data.md, "Sampling strategies").

A group is every rollout of one ``(step, validate, sample_index)``. A seeded hash of those keys scores each
group and breaks every tie, so a choice is reproducible from the seed. ``uniform`` decides as rollouts start;
``extremes`` and ``variance`` hold the spans of at most ``sample_candidates_per_step`` groups until the step
is decided. Each decision is written into the next batch's metadata (:data:`tracer.schema.BATCH_META_SAMPLING`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import statistics
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tracer import schema as S
from tracer.read import TracePaths, list_trace_files
from tracer.record.span_encoder import R_ARGS, R_EXC, R_OUT, R_SPAN, R_SPEC, R_TRAJ, as_reward
from tracer.record.spec import OpSpec
from tracer.storage.decisions import SOURCE_FILE, file_decisions, metadata_value
from tracer.storage.files import read_batches
from tracer.summary import RESPONSE_ID_KEYS

PENDING = "pending"
IN = "in"
OUT = "out"

UNIFORM = "uniform"
EXTREMES = "extremes"
VARIANCE = "variance"
BY_REWARD = "reward"
BY_LENGTH = "length"

#: Buckets (step, validate) remembered before the oldest is forgotten.
MAX_BUCKETS = 64
#: Candidate groups held per step, as a multiple of N, unless configured.
CANDIDATE_FACTOR = 4

# Why a step was decided (the ``decided_by`` field of a decision).
BY_COMPLETE = "complete"
BY_LATER_STEP = "later step"
BY_QUIET = "quiet"
BY_FLUSH = "flush"
BY_EVICTED = "too many open steps"

# Ranks of kept groups (the ``rank`` field of a kept group).
RANK_HIGH = "high"
RANK_LOW = "low"


def sample_score(seed: int, step: Any, validate: Any, sample_index: Any) -> float:
    """Seeded, order-independent score of a sample in [0, 1)."""
    digest = hashlib.blake2b(f"{seed}\x1f{step}\x1f{bool(validate)}\x1f{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class Group:
    """What a strategy knows of one group: ``sample_index``, seeded score, one finite value per trajectory."""

    key: Any
    score: float
    values: tuple[float, ...] = ()

    @property
    def exact_mean(self) -> Fraction | None:
        """Mean of the values, exactly (None without any): groups rank by it."""
        return statistics.mean(map(Fraction, self.values)) if self.values else None

    @property
    def exact_variance(self) -> Fraction | None:
        """Population variance of the values, exactly (None without any): groups rank by it."""
        return statistics.pvariance(map(Fraction, self.values)) if self.values else None


def _as_float(x: Fraction | None) -> float | None:
    """``x`` rounded to a float as a decision writes it (inf past the float range)."""
    if x is None:
        return None
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def variance_rank(group: Group) -> tuple[int, Fraction]:
    """Sort key of ``variance``: values that differ (largest variance first), then all equal, then none."""
    var = group.exact_variance
    return (2, Fraction(0)) if var is None else (0 if len(set(group.values)) > 1 else 1, -var)


def choose_groups(strategy: str, groups: Sequence[Group], limit: int) -> list[tuple[Group, str | None]]:
    """The groups ``strategy`` keeps, at most ``limit``, in any order the same, with their ``extremes`` rank or None;
    ties go to the lower seeded score (sorts are stable over the score order)."""
    if limit <= 0:
        return []
    by_score = sorted(groups, key=lambda g: (g.score, str(g.key)))
    if strategy == UNIFORM:
        return [(g, None) for g in by_score[:limit]]
    if strategy == VARIANCE:
        return [(g, None) for g in sorted(by_score, key=variance_rank)[:limit]]
    if strategy != EXTREMES:
        raise ValueError(f"unknown sample_strategy {strategy!r}; choose {UNIFORM}, {EXTREMES} or {VARIANCE}")
    known = [g for g in by_score if g.values]
    means = {id(g): g.exact_mean or Fraction(0) for g in known}
    high = sorted(known, key=lambda g: -means[id(g)])[: (limit + 1) // 2]
    taken = {id(g) for g in high}
    low = sorted((g for g in known if id(g) not in taken), key=lambda g: means[id(g)])[: limit - len(high)]
    unknown = [(g, None) for g in by_score if not g.values]
    return [*((g, RANK_HIGH) for g in high), *((g, RANK_LOW) for g in low), *unknown][:limit]


def response_tokens(reply: Any) -> int | None:
    """Response token ids in what an llm span returned (the keys ``tracer.summary`` reads), or None."""
    if reply is None or isinstance(reply, (str, bytes)):
        return None
    outputs = reply.get("outputs") if isinstance(reply, Mapping) else getattr(reply, "outputs", None)
    if isinstance(outputs, (list, tuple)) and outputs:  # vLLM's RequestOutput
        reply = outputs[0]
    for key in RESPONSE_ID_KEYS:
        ids = reply.get(key) if isinstance(reply, Mapping) else getattr(reply, key, None)
        if ids is not None and not isinstance(ids, (str, bytes)):
            with contextlib.suppress(TypeError):
                return len(ids)
    return None


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


@dataclass(slots=True, eq=False)
class _Seen:
    """What the writer has seen of one trajectory of a held group."""

    ended: bool = False
    log_reward: float | None = None
    op_reward: float | None = None
    tokens: int | None = None

    @property
    def reward(self) -> float | None:
        return self.log_reward if self.log_reward is not None else self.op_reward


@dataclass(slots=True, eq=False)
class Sample:
    """One prompt's sampling state (a group), shared by its rollouts' trajectories."""

    key: Any
    score: float
    state: str
    trajectories: list[Any] = field(default_factory=list, init=False)
    #: Per trajectory (by root span id): what was seen (extremes/variance only).
    seen: dict[int, _Seen] = field(default_factory=dict, init=False)


@dataclass(slots=True, eq=False)
class _Bucket:
    admitted: dict[Any, Sample] = field(default_factory=dict)
    excluded: set[Any] = field(default_factory=set)
    decided: bool = False
    last_admit: float = field(default_factory=time.monotonic)
    #: Writer cycle at which a later step started (None: not yet).
    due_epoch: int | None = None
    over_bound: int = 0
    #: The decision, once made (updated by late groups).
    record: dict[str, Any] | None = None


def _drop(bucket: _Bucket, sample: Sample) -> None:
    """Leave ``sample``'s group out of ``bucket``'s step: its trajectories stop recording."""
    del bucket.admitted[sample.key]
    bucket.excluded.add(sample.key)
    sample.state = OUT
    for traj in sample.trajectories:
        traj.recording = False


class StepSampler:
    """Chooses which ``limit`` groups of each (step, validate) are recorded; ``decide_after_s``: quiet time after which
    a choice is final; ``candidates``: groups held until extremes/variance decide (None: :data:`CANDIDATE_FACTOR` x).
    """

    def __init__(
        self,
        limit: int,
        seed: int,
        decide_after_s: float,
        strategy: str = UNIFORM,
        by: str = BY_REWARD,
        candidates: int | None = None,
    ) -> None:
        self.limit = limit
        self.seed = seed
        self.decide_after_s = decide_after_s
        self.strategy = strategy
        self.by = by
        self.candidates = candidates if candidates is not None else CANDIDATE_FACTOR * limit
        #: True when spans must be watched for rewards and lengths before deciding.
        self.watches = strategy != UNIFORM
        # Reentrant: a signal handler that starts a trajectory may interrupt a holder of this lock.
        self._lock = threading.RLock()
        self._buckets: dict[tuple[Any, bool], _Bucket] = {}
        self._epoch = 0
        self._unwritten: dict[tuple[Any, bool], dict[str, Any]] = {}
        #: Span records of groups not decided yet, in arrival order (see :meth:`gate`).
        self.held: list[tuple[Any, ...]] = []

    def parameters(self) -> dict[str, Any]:
        """The strategy and its parameters (written into every file's metadata)."""
        out: dict[str, Any] = {"strategy": self.strategy, "limit": self.limit, "seed": self.seed}
        if self.watches:
            out.update(by=self.by, candidates_per_step=self.candidates, decide_after_s=self.decide_after_s)
        return out

    def admit(self, step: Any, validate: Any, sample_index: Any) -> Sample | None:
        """Return the sample's state if it is (so far) chosen, else None."""
        bkey = (step, bool(validate))
        with self._lock:
            bucket = self._buckets.get(bkey)
            if bucket is None:
                bucket = self._buckets[bkey] = _Bucket()
                # A later step ends the earlier ones: uniform decides them now, the others a writer cycle later.
                for okey, other in self._buckets.items() if isinstance(step, int) else ():
                    if isinstance(okey[0], int) and okey[0] < step and not other.decided:
                        if not self.watches:
                            self._decide(okey, other, BY_LATER_STEP)
                        elif other.due_epoch is None:
                            other.due_epoch = self._epoch
                if len(self._buckets) > MAX_BUCKETS:
                    okey = next(iter(self._buckets))
                    other = self._buckets.pop(okey)
                    if not other.decided:
                        self._decide(okey, other, BY_EVICTED)
            sample = bucket.admitted.get(sample_index)
            if sample is not None:
                return sample if sample.state != OUT else None
            if sample_index in bucket.excluded:
                return None
            score = sample_score(self.seed, step, validate, sample_index)
            if bucket.decided:
                if len(bucket.admitted) >= self.limit:
                    bucket.excluded.add(sample_index)
                    self._changed(bkey, bucket)
                    return None
                sample = bucket.admitted[sample_index] = Sample(sample_index, score, IN)
                self._changed(bkey, bucket, late=sample)
                return sample
            if self.watches:
                if len(bucket.admitted) >= self.candidates:
                    bucket.excluded.add(sample_index)
                    bucket.over_bound += 1
                    return None
            elif len(bucket.admitted) >= self.limit:
                worst = max(bucket.admitted.values(), key=lambda s: s.score)
                if score >= worst.score:
                    bucket.excluded.add(sample_index)
                    return None
                _drop(bucket, worst)
            sample = bucket.admitted[sample_index] = Sample(sample_index, score, PENDING)
            bucket.last_admit = time.monotonic()
            return sample

    def observe(self, traj: Any, ended: bool, log_reward: Any, op_reward: Any, reply: Any) -> None:
        """Note what one span of a held trajectory says (writer thread, in recording order): ``ended`` (the root),
        a ``log_reward`` span's reward, a reward op's return, an llm span's ``reply``; each None where absent."""
        sample = traj.sample
        with self._lock:
            seen = sample.seen.setdefault(traj.root_span_id, _Seen())
            seen.ended = seen.ended or ended
            value = _finite(log_reward)
            if value is not None:
                seen.log_reward = value
            value = _finite(op_reward)
            if value is not None:
                seen.op_reward = value
            if reply is not None:
                n = response_tokens(reply)
                if n is not None:
                    seen.tokens = (seen.tokens or 0) + n

    def decide(self, force: bool = False) -> None:
        """Make final the choice of every step that is ready (all if ``force``); once per writer cycle."""
        now = time.monotonic()
        with self._lock:
            for bkey, bucket in self._buckets.items():
                if bucket.decided:
                    continue
                if force:
                    self._decide(bkey, bucket, BY_FLUSH)
                elif not self.watches:
                    if now - bucket.last_admit >= self.decide_after_s:
                        self._decide(bkey, bucket, BY_QUIET)
                elif bucket.due_epoch is not None and self._epoch > bucket.due_epoch:
                    self._decide(bkey, bucket, BY_LATER_STEP)
                elif now - bucket.last_admit >= self.decide_after_s and self._complete(bucket):
                    self._decide(bkey, bucket, BY_COMPLETE)
            self._epoch += 1

    def take_decisions(self) -> list[dict[str, Any]]:
        """Decisions made or changed since the last call (to write into the next batch's metadata)."""
        with self._lock:
            out = list(self._unwritten.values())
            self._unwritten.clear()
            return out

    @property
    def has_decisions(self) -> bool:
        """Decisions wait to be written."""
        return bool(self._unwritten)

    def gate(self, records: list[tuple[Any, ...]], force: bool) -> list[tuple[Any, ...]]:
        """The span records to write now, of the held ones and ``records`` (writer thread; ``force``: decide all);
        spans of groups not decided yet are held, extremes/variance see their ends, rewards and lengths first."""
        for rec in records if self.watches else ():
            traj = rec[R_TRAJ]
            if traj is None or traj.sample is None or traj.sample.state != PENDING:
                continue
            spec: OpSpec = rec[R_SPEC]
            op = spec.special is None and rec[R_EXC] is None
            self.observe(
                traj,
                rec[R_SPAN] == traj.root_span_id,
                rec[R_ARGS][0] if spec.special == "reward" else None,
                as_reward(rec[R_OUT]) if op and spec.kind == S.KIND_REWARD else None,
                rec[R_OUT] if op and spec.kind == S.KIND_LLM else None,
            )
        self.decide(force)
        ready: list[tuple[Any, ...]] = []
        held: list[tuple[Any, ...]] = []
        for rec in itertools.chain(self.held, records):
            traj = rec[R_TRAJ]
            state = IN if traj is None or traj.sample is None else traj.sample.state
            if state == IN:
                ready.append(rec)
            elif state == PENDING:
                held.append(rec)
        self.held = held
        return ready

    def _complete(self, bucket: _Bucket) -> bool:
        seen = [s.seen.get(t.root_span_id) for s in bucket.admitted.values() for t in s.trajectories]
        return all(x is not None and x.ended and (self.by != BY_REWARD or x.reward is not None) for x in seen)

    def _group(self, sample: Sample) -> Group:
        seen = [sample.seen.get(traj.root_span_id) for traj in sample.trajectories]
        values = [x.reward if self.by == BY_REWARD else x.tokens for x in seen if x is not None]
        return Group(sample.key, sample.score, tuple(float(v) for v in values if v is not None))

    def _decide(self, bkey: tuple[Any, bool], bucket: _Bucket, why: str) -> None:
        bucket.decided = True
        kept: list[dict[str, Any]] = []
        if not self.watches:
            for sample in bucket.admitted.values():
                if sample.state == PENDING:
                    sample.state = IN
                kept.append({S.SAMPLE_INDEX: sample.key, "trajectories": len(sample.trajectories)})
        else:
            chosen = choose_groups(self.strategy, [self._group(s) for s in bucket.admitted.values()], self.limit)
            keep = {g.key for g, _ in chosen}
            for sample in list(bucket.admitted.values()):
                sample.seen.clear()
                if sample.key in keep:
                    sample.state = IN
                else:
                    _drop(bucket, sample)
            for g, rank in chosen:
                entry: dict[str, Any] = {
                    S.SAMPLE_INDEX: g.key,
                    "trajectories": len(bucket.admitted[g.key].trajectories),
                    "value": _as_float(g.exact_mean if self.strategy == EXTREMES else g.exact_variance),
                }
                kept.append(entry if rank is None else {**entry, "rank": rank})
        bucket.record = {
            S.STEP: bkey[0],
            S.VALIDATE: bkey[1],
            **self.parameters(),
            "decided_by": why,
            "kept": kept,
            "dropped_groups": len(bucket.excluded) - bucket.over_bound,
            "dropped_over_bound": bucket.over_bound,
            "late_kept": 0,
        }
        self._unwritten[bkey] = bucket.record

    def _changed(self, bkey: tuple[Any, bool], bucket: _Bucket, late: Sample | None = None) -> None:
        """A group arrived after the decision: update the decision's counts."""
        record = bucket.record
        if record is None:
            return
        if late is not None:
            record["late_kept"] += 1
            record["kept"].append({S.SAMPLE_INDEX: late.key, "trajectories": None, "late": True})
        record["dropped_groups"] = len(bucket.excluded) - bucket.over_bound
        self._unwritten[bkey] = record


def decisions_json(decisions: Iterable[Mapping[str, Any]]) -> str:
    """The text written under :data:`tracer.schema.BATCH_META_SAMPLING`."""
    return metadata_value([dict(d) for d in decisions]).decode()


def read_sampling(path: TracePaths) -> list[dict[str, Any]]:
    """Every sampling decision written under ``path`` (docs/data.md), the last version of each per shard, sorted by
    ``file``, ``source_file`` (the deciding shard), step and validate."""
    out: list[dict[str, Any]] = []
    for file in list_trace_files(path):
        batches = read_batches(file, [S.TRACE_ID])
        customs = [custom for _, custom in batches.with_metadata()]
        schema_meta = batches.schema.metadata if batches.schema is not None else None
        out.extend({**d, "file": file} for d in file_decisions(file, schema_meta, customs))

    def order(d: dict[str, Any]) -> tuple[Any, ...]:
        step = d.get(S.STEP)
        return d["file"], d[SOURCE_FILE], step if isinstance(step, int) else -1, bool(d.get(S.VALIDATE))

    return sorted(out, key=order)
