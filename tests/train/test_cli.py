"""`specbench train` end to end on a tiny random target: trains, exports loadable heads, resumes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specbench.train.cli import main, parse_head_args

ARGS = ["train", "--drafter", "dflash,jetspec-tree", "--target", "random:tiny-llama", "--synthetic-prompts", "6",
        "--max-new-tokens", "12", "--batch-size", "3", "--head-arg", "block_size=4", "--head-arg", "anchors=3",
        "--quiet"]


def test_train_exports_heads_and_resumes(tmp_path, capsys) -> None:
    from specbench.drafters.heads.parallel import DFlashDrafter
    from specbench.models import load_target

    assert main(ARGS + ["--out", str(tmp_path), "--steps", "2"]) == 0
    assert (tmp_path / "heads" / "dflash" / "head.safetensors").is_file()
    DFlashDrafter(load_target("random:tiny-llama"), checkpoint=str(tmp_path / "heads" / "dflash"))
    assert main(ARGS + ["--out", str(tmp_path), "--steps", "3", "--reschedule"]) == 0
    assert "resumed at step 2" in capsys.readouterr().err


def test_head_args_are_parsed_per_head() -> None:
    got = parse_head_args(["block_size=8", "jetspec:losses={fkl: 1}"], ["dflash", "jetspec"])
    assert got == {"dflash": {"block_size": 8}, "jetspec": {"block_size": 8, "losses": {"fkl": 1}}}
    with pytest.raises(ValueError, match="not among the heads"):
        parse_head_args(["eagle3:x=1"], ["dflash"])


@pytest.mark.slow
def test_gpu_script_dry_run(tmp_path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "train_heads_gpu.py"
    res = subprocess.run([sys.executable, str(script), "--device", "cpu", "--target", "random:tiny-llama", "--dry-run",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert {"dflash.tar", "jetspec.tar", "jetspec-tree.tar", "summary.json", "train_log.jsonl"} <= set(files)
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in tmp_path.iterdir())


def test_labels_and_grid() -> None:
    from specbench.train.cli import expand_grid, parse_drafters, parse_token_count

    labels = parse_drafters("dflash,deep=dflash,jetspec")
    assert labels == {"dflash": "dflash", "deep": "dflash", "jetspec": "jetspec"}
    settings = parse_head_args(["deep:num_layers=2"], list(labels))
    grown, got = expand_grid(labels, settings, ["jetspec:block_size=8", "num_taps=1,5"])
    assert grown["jetspec-block_size8"] == "jetspec" and got["jetspec-block_size8"] == {"block_size": 8}
    assert got["deep-num_taps5"] == {"num_layers": 2, "num_taps": 5} and "dflash-num_taps1" in grown
    assert len(grown) == 3 + 1 + 2 * 3
    assert [parse_token_count(t) for t in ("0.4M", "250k", "1e6", "77")] == [400_000, 250_000, 1_000_000, 77]
    with pytest.raises(ValueError, match="twice"):
        parse_drafters("dflash,dflash")


def test_corpus_then_training_at_scale(tmp_path, capsys) -> None:
    """corpus generate (cut after one shard, then finished), status, train on it with a grid head,
    validation and snapshots over two calls, the report, and a packed copy resumed elsewhere."""
    import json

    corpus = tmp_path / "corpus"
    gen = ["corpus", "generate", "--out", str(corpus), "--target", "random:tiny-llama", "--sets", "synthetic:14",
           "--max-new-tokens", "10", "--temperatures", "0,0.9", "--shard-size", "5", "--gen-batch", "4", "--quiet"]
    assert main(gen + ["--max-shards", "1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["finished"] == [0]
    assert main(gen) == 0
    capsys.readouterr()
    assert main(["corpus", "status", str(corpus), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["finished"] == [0, 1, 2] and status["response_tokens"] > 0 and status["sequences"] == 28
    run = tmp_path / "run"
    train = ["train", "--drafter", "dflash", "--grid", "num_layers=2", "--target", "random:tiny-llama", "--corpus",
             str(corpus), "--val-prompts", "3", "--out", str(run), "--steps", "8", "--batch-size", "3",
             "--head-arg", "block_size=4", "--head-arg", "anchors=3", "--val-every", "4", "--val-tau-every", "4",
             "--val-tau-prompts", "2", "--val-tau-budgets", "4", "--val-max-new-tokens", "8", "--snapshot-tokens", "50",
             "--log-every", "2", "--quiet"]
    assert main(train + ["--until-step", "4"]) == 0
    assert main(train) == 0
    err = capsys.readouterr().err
    assert "resumed at step 4 of 8" in err and "22 training and 3 validation sequences" in err
    for label in ("dflash", "dflash-num_layers2"):
        assert (run / "heads" / label / "head.safetensors").is_file() and (run / "plots" / f"{label}.png").is_file()
    layers = json.loads((run / "heads" / "dflash-num_layers2" / "config.json").read_text())["head"]["num_layers"]
    assert layers == 2 and list((run / "snapshots").iterdir())
    assert main(["train-report", str(run), "--json", "--no-plot"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["head"] for r in report] == ["dflash", "dflash-num_layers2"] and all("val_tau4" in r for r in report)
    assert main(["train-report", str(run), "--plots", str(tmp_path / "small"), "--compact"]) == 0
    from PIL import Image

    for label in ("dflash", "dflash-num_layers2"):
        small, full = tmp_path / "small" / f"{label}.png", run / "plots" / f"{label}.png"
        with Image.open(small) as im:
            assert im.mode == "P" and small.stat().st_size < full.stat().st_size / 2
    moved = tmp_path / "moved"
    assert main(["train-pack", str(run), str(moved)]) == 0
    more = [a if a != str(run) else str(moved) for a in train]
    assert main(more + ["--steps", "10", "--reschedule"]) == 0
    assert "resumed at step 8 of 10" in capsys.readouterr().err


def test_a_setting_a_head_does_not_take_names_the_flag(tmp_path) -> None:
    """An unlabelled --head-arg reaches every head: eagle3 takes no block_size, and the CLI says which flag."""
    args = ["train", "--drafter", "dflash,eagle3", "--target", "random:tiny-llama", "--synthetic-prompts", "2",
            "--head-arg", "block_size=4", "--out", str(tmp_path / "run"), "--steps", "1", "--quiet"]
    res = subprocess.run([sys.executable, "-m", "specbench.cli", *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "--head-arg" in res.stderr and "block_size" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()


def test_head_convert_writes_int4_that_loads(tmp_path, capsys) -> None:
    """`specbench head-convert`: an exported int8 head stored again as int4 (about half the bytes) and as int3
    loads into its drafter; converting onto the source itself and a group int3 cannot pack are refused."""
    from specbench.drafters.heads.parallel import DFlashDrafter
    from specbench.models import load_target

    assert main(ARGS + ["--out", str(tmp_path / "run"), "--steps", "1"]) == 0
    src, dest = tmp_path / "run" / "heads" / "dflash", tmp_path / "int4"
    assert main(["head-convert", str(src), str(dest), "--storage", "int4"]) == 0
    assert "int4" in capsys.readouterr().out
    assert (dest / "head.safetensors").stat().st_size < 0.7 * (src / "head.safetensors").stat().st_size
    DFlashDrafter(load_target("random:tiny-llama"), checkpoint=str(dest))
    with pytest.raises(SystemExit, match="DEST must differ"):
        main(["head-convert", str(src), str(src), "--storage", "int4"])
    assert main(["head-convert", str(src), str(tmp_path / "int3"), "--storage", "int3"]) == 0
    assert (tmp_path / "int3" / "head.safetensors").stat().st_size < (dest / "head.safetensors").stat().st_size
    DFlashDrafter(load_target("random:tiny-llama"), checkpoint=str(tmp_path / "int3"))
    with pytest.raises(SystemExit, match="--group must be a multiple of 8"):
        main(["head-convert", str(src), str(tmp_path / "x"), "--storage", "int3", "--group", "12"])
    bare = tmp_path / "bare"  # a config that does not say which target the head drafts for
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="names no target_name: pass --target"):
        main(["head-convert", str(bare), str(tmp_path / "out"), "--storage", "int4"])


def test_init_heads_starts_a_fresh_run_from_trained_heads(tmp_path, capsys) -> None:
    """--init-heads: the new run's heads begin as the checkpoints' (fp32, int8-rounded weights), a head of
    another architecture is refused naming the flag, and a resumed run ignores it."""
    import torch

    from specbench.drafters.heads.checkpoint import load_head
    from specbench.models import load_target
    from specbench.train.cli import build_objectives, init_sources, parse_drafters
    from specbench.train.sequences import TrainingSequence
    from specbench.train.trainer import TrainConfig, Trainer

    first = tmp_path / "first"
    assert main(ARGS + ["--out", str(first), "--steps", "2"]) == 0
    target = load_target("random:tiny-llama")
    settings = parse_head_args(["block_size=4", "anchors=3"], ["dflash", "jetspec-tree"])
    objectives = build_objectives(target, parse_drafters("dflash,jetspec-tree"), settings)
    seqs = [TrainingSequence(prompt=[1, 2, 3, 4], response=list(range(5, 14))) for _ in range(3)]
    trainer = Trainer(target, objectives, seqs, TrainConfig(batch_size=3, steps=2), tmp_path / "second")
    before = {k: v.clone() for k, v in objectives["dflash"].head.state_dict().items()}
    trainer.init_heads(init_sources(first / "heads", objectives, target))
    saved, _ = load_head(first / "heads" / "dflash", target, dtype=torch.float32)
    after = objectives["dflash"].head.state_dict()
    assert all(torch.equal(after[k], saved[k].to(after[k].dtype)) for k in saved)
    assert any(not torch.equal(after[k], before[k]) for k in saved)
    assert trainer.init_sources["jetspec-tree"].endswith("jetspec-tree")

    wide = build_objectives(target, parse_drafters("dflash"), parse_head_args(["block_size=8"], ["dflash"]))
    other = Trainer(target, wide, seqs, TrainConfig(batch_size=3, steps=2), tmp_path / "third")
    with pytest.raises(ValueError, match="block_size.*--head-arg dflash:"):
        other.init_heads(init_sources(first / "heads", wide, target))
    with pytest.raises(ValueError, match="--init-heads .*no checkpoint for head 'jetspec'"):
        init_sources(first / "heads", build_objectives(target, ["jetspec"], {"jetspec": {"block_size": 4}}), target)

    run = tmp_path / "run"
    assert main(ARGS + ["--out", str(run), "--steps", "2", "--init-heads", str(first / "heads")]) == 0
    assert "heads start from" in capsys.readouterr().err
    assert main(ARGS + ["--out", str(run), "--steps", "3", "--reschedule", "--init-heads", str(first / "heads")]) == 0
    err = capsys.readouterr().err
    assert "resumed at step 2" in err and "heads start from" not in err


def test_init_heads_grows_a_shallower_head_without_changing_its_drafts(tmp_path) -> None:
    """--init-heads with --head-arg num_layers=2 on 1-layer checkpoints: the saved layer is the first, the added
    one starts as an identity map (zero wo and w_down), so the grown head's loss on a batch equals the saved
    head's; one step moves the added layer; growing into fewer layers is refused naming the flag."""
    import torch

    from specbench.models import load_target
    from specbench.train.cli import build_objectives, init_sources, parse_drafters
    from specbench.train.sequences import TrainingSequence
    from specbench.train.trainer import TrainConfig, Trainer, target_batch

    first = tmp_path / "first"
    assert main(ARGS + ["--out", str(first), "--steps", "2"]) == 0
    target = load_target("random:tiny-llama")
    labels = parse_drafters("dflash,jetspec-tree")
    seqs = [TrainingSequence(prompt=[1, 2, 3, 4], response=list(range(5 + i, 14 + i))) for i in range(3)]

    def trainer_for(layers: int, out: str) -> Trainer:
        settings = parse_head_args(["block_size=4", "anchors=3", f"num_layers={layers}"], list(labels))
        objectives = build_objectives(target, labels, settings)
        t = Trainer(target, objectives, seqs, TrainConfig(batch_size=3, steps=2, lr=1e-3), tmp_path / out)
        t.init_heads(init_sources(first / "heads", objectives, target))
        return t

    flat, deep = trainer_for(1, "flat"), trainer_for(2, "deep")
    assert "grown from 1 to 2 layers" in deep.init_sources["dflash"]
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    valid = torch.ones_like(tokens, dtype=torch.bool)
    batch = target_batch(target, tokens, valid, valid.clone(), flat.taps)
    for name in labels:
        head = deep.objectives[name].head
        assert not head.layers[1].attn.wo.weight.any() and not head.layers[1].mlp.w_down.weight.any()
        assert head.layers[1].attn.wqkv.weight.abs().sum() > 0  # the rest keeps its init: gradients can flow
        want, _ = flat.objectives[name].loss(batch, torch.Generator().manual_seed(0))
        got, _ = deep.objectives[name].loss(batch, torch.Generator().manual_seed(0))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    deep.train_step()
    assert deep.objectives["dflash"].head.layers[1].attn.wo.weight.any()

    three = tmp_path / "three"
    assert main(ARGS + ["--out", str(three), "--steps", "1", "--head-arg", "num_layers=3"]) == 0
    objectives = build_objectives(target, labels, parse_head_args(["block_size=4", "anchors=3", "num_layers=2"], list(labels)))
    shrink = Trainer(target, objectives, seqs, TrainConfig(batch_size=3, steps=2), tmp_path / "shrink")
    with pytest.raises(ValueError, match="num_layers.*--head-arg dflash:"):
        shrink.init_heads(init_sources(three / "heads", objectives, target))


def test_validation_needs_shard_zero(tmp_path, capsys) -> None:
    """The held-out prompts are the plan's first, in shard 0: a corpus without it is refused, naming the
    flags, rather than training with no validation at all."""
    corpus = tmp_path / "corpus"
    assert main(["corpus", "generate", "--out", str(corpus), "--target", "random:tiny-llama", "--sets", "synthetic:10",
                 "--max-new-tokens", "6", "--shard-size", "5", "--gen-batch", "5", "--shards", "1", "--quiet"]) == 0
    train = ["train", "--drafter", "dflash", "--target", "random:tiny-llama", "--corpus", str(corpus), "--out",
             str(tmp_path / "run"), "--steps", "2", "--batch-size", "2", "--head-arg", "block_size=4", "--quiet"]
    with pytest.raises(ValueError, match=r"--val-prompts 3: .* in shard 0, which corpus .* lacks \(it has shards \[1\]\).*"
                                         r"--shards 0,.*--val-prompts 0"):
        main(train + ["--val-prompts", "3"])
    assert main(train + ["--val-prompts", "0"]) == 0
    capsys.readouterr()
