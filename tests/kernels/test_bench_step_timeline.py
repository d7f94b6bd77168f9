"""scripts/bench_step.py's graph timeline: replays split evenly, the gaps between kernels attributed to the kernel
after them, and counts that do not split into the replays refused (CPU: synthetic kernel events)."""

from __future__ import annotations

import pytest

from kernel_cases import load_script  # noqa: E402


def _script():
    return load_script("bench_step")


def test_timeline_of_two_replays() -> None:
    bench = _script()
    # replay: a (2 us) at 0, b (3 us) 1 us later, a again 4 us after b; the second replay 100 us on, b's gap 2 us
    us = 1000
    events = [("a", 0, 2 * us), ("b", 3 * us, 3 * us), ("a", 10 * us, 2 * us),
              ("a", 100 * us, 2 * us), ("b", 104 * us, 3 * us), ("a", 111 * us, 2 * us)]
    t = bench.graph_timeline(list(reversed(events)), replays=2)  # any order: sorted by start
    assert t["kernels_per_replay"] == 3
    assert t["busy_us"] == pytest.approx(7.0)
    assert t["span_us"] == pytest.approx((12 + 13) / 2)
    assert t["gap_us"] == pytest.approx((5 + 6) / 2)
    by = {k["kernel"]: k for k in t["by_gap"]}
    assert by["a"]["calls_per_replay"] == 2 and by["a"]["mean_us"] == pytest.approx(2.0)
    assert by["a"]["mean_gap_before_us"] == pytest.approx((0 + 4 + 0 + 4) / 4)  # the first of a replay has none
    assert by["b"]["mean_gap_before_us"] == pytest.approx((1 + 2) / 2)
    assert [k["kernel"] for k in t["by_gap"]] == ["a", "b"]  # by total gap: a 8 us, b 3 us
    assert [(g["after"], g["before"], g["index"]) for g in t["largest_gaps"]] == [("b", "a", 2), ("a", "b", 1)]
    assert t["largest_gaps"][0]["gap_us"] == pytest.approx(4.0)


def test_timeline_refuses_uneven_replays() -> None:
    bench = _script()
    with pytest.raises(ValueError, match="do not split"):
        bench.graph_timeline([("a", 0, 1), ("b", 2, 1), ("a", 5, 1)], replays=2)
