"""scripts/tau_table.py: a table filled in pieces (a first run over some items, a second machine from the
other end with --reverse) has exactly the rows of one uninterrupted run, each once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tau_table.py"


def run_script(data: Path, out: Path, *extra: str) -> None:
    cmd = [sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out), "--datasets", "gsm8k",
           "--drafters", "ngram,self", "--budgets", "4", "--self-budgets", "2", "--max-new-tokens", "8",
           "--threads", "1", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def rows_by_key(path: Path) -> dict[tuple, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    keyed = {(r["id"], r["drafter"], r["tree"], r["budget"]): r for r in rows}
    assert len(keyed) == len(rows), "duplicate rows"
    return keyed


@pytest.mark.slow  # three runs of the script (~30-60 s on CI's cores); the shards test below covers resuming by default
def test_pieces_from_both_ends_equal_one_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    questions = ["What is 2 + 3?", "Name a colour.", "Count to five.", "Say hello in French."]
    (data / "gsm8k_test.jsonl").write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n"
                                                   for q in questions))
    whole, pieces = tmp_path / "whole.jsonl", tmp_path / "pieces.jsonl"
    run_script(data, whole, "--n", "4")
    run_script(data, pieces, "--n", "1")                  # item 0
    run_script(data, pieces, "--n", "4", "--reverse")     # items 3, 2, 1; item 0 is skipped
    order = [json.loads(line)["id"] for line in pieces.read_text().splitlines()]
    assert list(dict.fromkeys(order)) == ["0", "3", "2", "1"]
    a, b = rows_by_key(whole), rows_by_key(pieces)
    assert a.keys() == b.keys() and len(a) == 4 * 2  # ngram/ddtree/4 and self/chain/2 per item
    for key in a:
        assert (a[key]["tau"], a[key]["new_tokens"]) == (b[key]["tau"], b[key]["new_tokens"]), key
        counts = a[key]["accepted_counts"]  # rounds by drafted tokens accepted: they make up the row's tau
        assert sum(counts) == a[key]["rounds"] and counts[-1] > 0
        assert sum((k + 1) * c for k, c in enumerate(counts)) / sum(counts) == pytest.approx(a[key]["tau"])


def test_shards_of_a_cut_run_merge_once_and_damage_fails(tmp_path: Path) -> None:
    """A --parallel run cut before its merge leaves OUT.shardK.jsonl files: merge_shards folds them into OUT,
    each row once (the last of equal keys), and a cut last line is dropped; a damaged inner line raises."""
    sys.path.insert(0, str(SCRIPT.parent))
    from tau_table import merge_shards, read_rows

    def row(i: str, tau: float) -> str:
        return json.dumps({"dataset": "gsm8k", "id": i, "drafter": "ngram", "tree": "ddtree", "budget": 4, "tau": tau})

    out = tmp_path / "tau.jsonl"
    out.write_text(row("0", 1.0) + "\n")
    (tmp_path / "tau.shard0.jsonl").write_text(row("0", 1.0) + "\n" + row("2", 2.0) + "\n")
    (tmp_path / "tau.shard1.jsonl").write_text(row("1", 3.0) + "\n" + '{"dataset": "gsm8k", "id": "3", "dra')
    merged = merge_shards(out)
    assert sorted((r["id"], r["tau"]) for r in merged) == [("0", 1.0), ("1", 3.0), ("2", 2.0)]
    assert sorted(r["id"] for r in read_rows(out)) == ["0", "1", "2"]
    (tmp_path / "bad.jsonl").write_text(row("0", 1.0) + "\n{not json\n" + row("1", 1.0) + "\n")
    with pytest.raises(json.JSONDecodeError):
        read_rows(tmp_path / "bad.jsonl")


def test_device_replay_rows_equal_the_host_walk(tmp_path: Path) -> None:
    """--replay device (the CUDA default: the device round, a drafter per configuration) writes the host
    walk's taus, with the shipped dflash head on the default target: chain replays on the device here,
    ddtree (built on the host on the CPU) keeps the host walk (the engine's equality for every capturable
    drafter: tests/spine/test_capturable.py)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k_test.jsonl").write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n"
                                                   for q in ["What is 2 + 3?", "Count to five."]))
    host, device = tmp_path / "host.jsonl", tmp_path / "device.jsonl"
    head = ["--heads", f"dflash={SCRIPT.parents[1] / 'specbench' / 'heads' / 'dflash-smollm2-135m'}", "--drafters", "dflash",
            "--trees", "ddtree,chain"]
    run_script(data, host, "--n", "2", "--replay", "host", *head)
    run_script(data, device, "--n", "2", "--replay", "device", *head)
    a, b = rows_by_key(host), rows_by_key(device)
    assert a.keys() == b.keys() and len(a) == 2 * 2
    for key in a:
        assert (a[key]["tau"], a[key]["rounds"], a[key]["new_tokens"]) == (b[key]["tau"], b[key]["rounds"],
                                                                          b[key]["new_tokens"]), key


def test_compare_pairs_prompts_and_rejects_bad_specs(tmp_path: Path) -> None:
    """--compare: the paired difference is taken over the prompts both sides have (a prompt with one side only
    is left out), per budget and dataset and over all; a spec without DRAFTER/TREE on both sides fails."""
    sys.path.insert(0, str(SCRIPT.parent))
    from tau_table import paired

    def row(d: str, ds: str, i: str, tau: float, budget: int = 16) -> dict:
        return {"dataset": ds, "id": i, "drafter": d, "tree": "ddtree", "budget": budget, "tau": tau}

    rows = [row("a", "x", "0", 3.0), row("b", "x", "0", 2.0), row("a", "x", "1", 4.0), row("b", "x", "1", 2.0),
            row("a", "y", "0", 2.5), row("b", "y", "0", 2.5), row("a", "y", "9", 9.0),  # y/9: no b row
            row("a", "x", "0", 1.0, budget=64)]                                      # b64: no b at all
    out = {(d["budget"], d["dataset"]): d for d in paired(rows, "a/ddtree - b/ddtree")}
    assert set(out) == {(16, "x"), (16, "y"), (16, "all")}
    assert out[(16, "x")]["mean"] == pytest.approx(1.5) and out[(16, "x")]["se"] == pytest.approx(0.5)
    assert out[(16, "y")]["n"] == 1 and out[(16, "y")]["mean"] == 0.0
    assert out[(16, "all")]["n"] == 3 and out[(16, "all")]["mean"] == pytest.approx(1.0)
    with pytest.raises(SystemExit, match="DRAFTER/TREE"):
        paired(rows, "a - b/ddtree")
    with pytest.raises(SystemExit, match="no prompt"):
        paired(rows, "a/chain - b/ddtree")


def test_drafter_args_build_one_label_differently_and_bad_ones_fail(tmp_path: Path) -> None:
    """--drafter-arg LABEL:KEY=VALUE: the shipped jetspec head under a second label drafts blocks of 4 (its
    depth cap), the first label keeps the trained 16, and both replay; a label that is no row, or an item
    without LABEL:KEY=VALUE, fails before anything loads, naming the flag."""
    import argparse

    sys.path.insert(0, str(SCRIPT.parent))
    from tau_table import drafter_builders, parse_drafter_args

    assert parse_drafter_args(["a:block_size=8", "a:name=x y", "b:J=[1, 2]"]) == {
        "a": {"block_size": 8, "name": "x y"}, "b": {"J": [1, 2]}}
    for bad in ("block_size=8", "a:block_size", ":k=1"):
        with pytest.raises(SystemExit, match="--drafter-arg takes LABEL:KEY=VALUE"):
            parse_drafter_args([bad])
    head = SCRIPT.parents[1] / "specbench" / "heads" / "jetspec-smollm2-135m"
    args = argparse.Namespace(heads=f"full={head},short={head}", drafter_arg=["nosuch:block_size=4"],
                              baselines=False, heads_dir=None, self_layers=None)
    with pytest.raises(SystemExit, match="--drafter-arg names nosuch"):
        drafter_builders(None, args)

    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k_test.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    out = tmp_path / "rows.jsonl"
    run_script(data, out, "--n", "1", "--heads", f"full={head},short={head}", "--drafter-arg", "short:block_size=4",
               "--drafters", "full,short", "--trees", "ddtree", "--max-new-tokens", "24")
    rows = rows_by_key(out)
    assert set(rows) == {("0", "full", "ddtree", 4), ("0", "short", "ddtree", 4)}
    assert {r["kind"] for r in rows.values()} == {"jetspec"}

    from specbench.models import load_target

    args.drafter_arg = ["short:block_size=4"]
    built = {label: build() for label, build in drafter_builders(load_target(None), args).items()}
    assert (built["full"].block_size, built["short"].block_size) == (16, 4)
    assert built["short"].max_path == 5  # a round accepts at most 3 drafted tokens and the bonus (+ the root)


def test_workers_on_cuda_are_capped_by_gpu_memory() -> None:
    """14 workers of 45 configurations each ran an H100 (79 GiB) out of memory on 2026-12-07: the cap lowers
    them to what fits, leaves a large GPU or a small table alone, and never goes below one worker."""
    sys.path.insert(0, str(SCRIPT.parent))
    import tau_table

    assert tau_table.workers_that_fit(14, 45, 79.2) < 14
    per_worker = tau_table.WORKER_BASE_GIB + 45 * tau_table.WORKER_GIB_PER_CONFIG
    assert tau_table.workers_that_fit(14, 45, 79.2) * per_worker <= 0.9 * 79.2
    assert tau_table.workers_that_fit(14, 15, 139.8) == 14
    assert tau_table.workers_that_fit(14, 45, None) == 14       # no nvidia-smi: as asked
    assert tau_table.workers_that_fit(14, 4000, 79.2) == 1
