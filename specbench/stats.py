"""Per-round and per-request records: tau, per-depth acceptance, stage timers, throughput."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

STAGES = ("draft", "tree", "verify_forward", "verify", "commit")


@dataclass
class RoundStats:
    accepted: int  # draft tokens accepted (the bonus token not counted)
    tree_size: int  # draft nodes verified (root excluded)
    emitted: int  # tokens appended to the output this round (after EOS / length truncation)
    times: dict[str, float] = field(default_factory=dict)


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


class StageTimer:
    """Accumulates wall time per stage; `sync` (e.g. torch.cuda.synchronize) runs before each reading
    so asynchronous device work is charged to the stage that launched it."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.times: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, sign: float = 1.0) -> Iterator[None]:
        """Add the block's wall time to stage `name` (sign -1: take it back, see `excluded`)."""
        if self.sync:
            self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                self.sync()
            self.times[name] = self.times.get(name, 0.0) + sign * (time.perf_counter() - t0)

    def excluded(self, name: str) -> AbstractContextManager[None]:
        """Time inside this block is taken back from stage `name` (e.g. a drafter's model passes that a
        tree policy's `grow` calls back inside the "tree" stage)."""
        return self.stage(name, -1.0)

    def pop(self) -> dict[str, float]:
        out, self.times = self.times, {}
        return out
