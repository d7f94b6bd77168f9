"""Prompts that are not valid UTF-8 or that the tokenizer refuses: a PromptError from the Python API,
a one-line error naming the flag from the CLI; prompts from a file or stdin, NUL bytes included."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from specbench.cli import main
from specbench.models import PRESETS, PromptError, load_target
from specbench.models.loader import build_model, save_hf_dir

REFUSING_TEMPLATE = "{{ raise_exception('this template takes no user turns') }}"


@pytest.fixture(scope="module")
def refusing_dir(smollm2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An hf:DIR target: tiny random weights, the default target's tokenizer, a chat template that
    refuses every prompt (as real templates do, e.g. for roles that do not alternate)."""
    out = tmp_path_factory.mktemp("refusing")
    cfg = PRESETS["tiny-llama"]
    model = build_model(cfg, None, dtype=torch.float32, device="cpu")
    save_hf_dir(cfg, model.state_dict(), out)
    source = Path(smollm2.meta["source"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    (out / "chat_template.jinja").write_text(REFUSING_TEMPLATE)
    return out


def test_the_api_names_the_bad_byte_or_character(smollm2) -> None:
    with pytest.raises(PromptError, match=r"not valid UTF-8: byte 0xff at byte offset 3 \(invalid start byte\)"):
        smollm2.encode(b"abc\xff")
    with pytest.raises(PromptError, match=r"not valid UTF-8: character '\\udcff' at offset 1 is a lone surrogate"):
        smollm2.encode_chat("a\udcff")  # what Python makes of the byte 0xff in a command-line argument
    with pytest.raises(PromptError, match="must be text"):
        smollm2.encode(123)  # type: ignore[arg-type]
    assert smollm2.encode(b"caf\xc3\xa9") == smollm2.encode("café")
    assert smollm2.encode_chat("a\x00b") != smollm2.encode_chat("ab")  # NUL is a character like any other


def test_a_prompt_the_tokenizer_refuses(refusing_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = load_target(f"hf:{refusing_dir}")
    with pytest.raises(PromptError, match="the tokenizer refused the prompt: TemplateError: this template takes no"):
        target.encode_chat("hello")
    assert target.encode("hello")  # without the template the tokenizer takes it
    assert main(["generate", "--target", f"hf:{refusing_dir}", "--prompt", "hello"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["specbench: error: --prompt: the tokenizer refused the prompt: TemplateError: this template "
                   "takes no user turns"]


def test_prompt_from_stdin_and_from_a_file(smollm2, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    text = "Say 'a\x00b' twice.\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main(["generate", "--prompt-file", "-", "--max-new-tokens", "3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompt"] == text and record["prompt_ids"] == smollm2.encode_chat(text)
    path = tmp_path / "prompt.txt"
    path.write_bytes(text.encode())
    assert main(["generate", "--prompt-file", str(path), "--raw", "--max-new-tokens", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_ids"] == smollm2.encode(text)
