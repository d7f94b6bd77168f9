"""Per-round and per-request records: tau, per-depth acceptance, stage timers, throughput."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

STAGES = ("draft", "tree", "verify_forward", "verify", "commit")


@dataclass
class RoundStats:
    accepted: int  # draft tokens accepted (the bonus token not counted)
    tree_size: int  # draft nodes verified (root excluded)
    emitted: int  # tokens appended to the output this round (after EOS / length truncation)
    times: dict[str, float] = field(default_factory=dict)
    # a side stage's own duration on its stream (JetSpec++'s foresight beside the verify forward): not
    # on the critical path; what it exposes is the main stream's time in that stage (`times`)
    side_time: float | None = None


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_time: float = 0.0
    decode_time: float = 0.0
    stop_reason: str = ""
    rounds: list[RoundStats] = field(default_factory=list)
    peak_memory_bytes: int = 0

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify pass, bonus token included (AR decoding: 1.0)."""
        return sum(r.accepted + 1 for r in self.rounds) / len(self.rounds) if self.rounds else 0.0

    @property
    def total_time(self) -> float:
        return self.prefill_time + self.decode_time

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens from decode rounds over decode time (the first token comes from prefill)."""
        made = self.new_tokens - 1
        return made / self.decode_time if self.decode_time > 0 and made > 0 else 0.0

    @property
    def e2e_tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    @property
    def mean_tree_size(self) -> float:
        return sum(r.tree_size for r in self.rounds) / len(self.rounds) if self.rounds else 0.0

    def accepted_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(r.accepted for r in self.rounds).items()))

    def acceptance_by_depth(self, max_depth: int | None = None) -> list[float]:
        """a[k-1] = fraction of rounds that accepted at least k draft tokens (k = 1..max_depth)."""
        if not self.rounds:
            return []
        depth = max_depth if max_depth is not None else max((r.tree_size for r in self.rounds), default=0)
        n = len(self.rounds)
        return [sum(r.accepted >= k for r in self.rounds) / n for k in range(1, depth + 1)]

    def stage_times(self) -> dict[str, float]:
        out = {s: 0.0 for s in STAGES}
        for r in self.rounds:
            for k, v in r.times.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "rounds": len(self.rounds),
            "tau": self.tau,
            "mean_tree_size": self.mean_tree_size,
            "prefill_s": self.prefill_time,
            "decode_s": self.decode_time,
            "decode_tok_s": self.decode_tokens_per_s,
            "e2e_tok_s": self.e2e_tokens_per_s,
            "stop_reason": self.stop_reason,
            "stage_s": self.stage_times(),
            "accepted_hist": self.accepted_histogram(),
            "accept_by_depth": self.acceptance_by_depth(),
            "peak_memory_bytes": self.peak_memory_bytes,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary()
        return d


class RoundClock:
    """Stage boundaries of a round, as CUDA events on a GPU (no device sync: read at the end of the
    request) or host clock readings on the CPU. `switch(name)` starts stage `name` (ending the
    previous one); `close()` ends the round. A stage may recur (e.g. draft, tree, draft, tree): its
    segments add up."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._pool: list[Any] = []
        self._used = 0
        self.rounds: list[list[tuple[str, Any]]] = []

    def begin_request(self) -> None:
        self._used = 0
        self.rounds = []

    def _stamp(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        if self._used == len(self._pool):
            self._pool.append(torch.cuda.Event(enable_timing=True))
        event = self._pool[self._used]
        self._used += 1
        event.record()
        return event

    def start_round(self) -> None:
        self.rounds.append([])

    def switch(self, name: str) -> None:
        self.rounds[-1].append((name, self._stamp()))

    def close(self) -> None:
        self.rounds[-1].append(("", self._stamp()))

    def times(self, index: int) -> dict[str, float]:
        """Seconds per stage of round `index` (events must have completed: after the request)."""
        marks = self.rounds[index]
        out: dict[str, float] = {}
        for (name, a), (_, b) in zip(marks, marks[1:]):
            dt = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            out[name] = out.get(name, 0.0) + dt
        return out
