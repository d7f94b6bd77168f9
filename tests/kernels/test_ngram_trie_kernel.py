"""The n-gram drafter's trie kernel against its reference (the drafter's tensor-op `lookup_trie`, itself
tested against plain loops in tests/spine/test_ngram_trie.py): every array equal, scores included, on random
and repetitive histories longer than one block of the suffix scan; then the drafter on the kernel drafts the
host path's tree round after round."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from ngram_rounds import check_device_rounds  # noqa: E402

from specbench.drafters.ngram import lookup_trie  # noqa: E402
from specbench.kernels.ngram_trie import BLOCK_S, ngram_trie  # noqa: E402


def test_matches_the_tensor_op_trie(device: str) -> None:
    rng = random.Random(0)
    drafted = 0
    for trial in range(48):
        size = [6, 40, BLOCK_S + 70, 2 * BLOCK_S + 9][trial % 4]
        vocab = [2, 3, 5, 50][trial // 4 % 4]
        width, matches = rng.choice([1, 3, 16, 20]), rng.choice([1, 3, 8])
        max_ngram = rng.randint(1, 4)
        min_ngram = rng.randint(1, max_ngram)
        tokens = [rng.randrange(vocab) for _ in range(size)]
        if trial % 3 == 0:  # a repeated span: many tied matches, some in an earlier block of the scan
            tokens = (tokens[:7] * (size // 7 + 1))[:size]
        history = torch.tensor(tokens, device=device)
        length = torch.tensor([rng.randint(1, size)], device=device)
        root = torch.tensor([rng.randrange(vocab)], device=device)
        want, count = lookup_trie(root, history, length, max_ngram, min_ngram, matches, width)
        tok, par, dep, scores, got_count = ngram_trie(history, length, root, max_ngram, min_ngram, matches, width)
        where = (trial, size, vocab, width, matches, max_ngram, min_ngram, int(length))
        assert torch.equal(got_count, count), where
        for got, ref in ((tok, want.tokens), (par, want.parents), (dep, want.depth)):
            assert torch.equal(got, ref), where
        real = slice(0, 1 + int(count))  # padding scores are -inf in both
        assert torch.equal(scores[real], want.scores[real]) if device == "cpu" else \
            torch.allclose(scores[real], want.scores[real], rtol=1e-12, atol=0), where
        assert torch.equal(torch.isinf(scores), torch.isinf(want.scores)), where
        drafted += int(count) > 0
    assert drafted > 20  # most cases matched something: the comparison was not of root-only tries


@pytest.mark.parametrize("tree", ["chain", "ddtree-vec"])
def test_drafter_on_the_kernel_drafts_the_host_tree(device: str, tree: str) -> None:
    assert check_device_rounds(torch.device(device), tree, trials=12, kernel=True) > 8


@pytest.mark.usefixtures("single_thread")
def test_greedy_sd_on_the_kernel_is_ar(device: str) -> None:
    """fp32 (on the CPU, the interpreter): device drafting through the kernel emits the AR tokens and accepts,
    round by round, what the host path accepts. The target sits where the kernel runs."""
    from targets import tiny_target

    from specbench.config import SpecConfig
    from specbench.drafters.ngram import NgramDrafter
    from specbench.engine import SpecDecoder

    target = tiny_target(num_layers=2, seed=3)
    target.model.to(device)
    prompt = [88, 3, 14, 15, 92, 65, 35, 89, 79, 3, 14, 15]
    want = SpecDecoder(target, SpecConfig(), max_seq_len=96).generate(prompt, 20).tokens
    spec = SpecConfig(drafter="ngram", tree="ddtree-vec", budget=6)
    host = SpecDecoder(target, spec, max_seq_len=96, drafter=NgramDrafter(target, on_device=False))
    kernel = SpecDecoder(target, spec, max_seq_len=96, drafter=NgramDrafter(target, on_device=True, kernel=True))
    a, b = host.generate(prompt, 20), kernel.generate(prompt, 20)
    assert a.tokens == b.tokens == want
    assert [r.accepted for r in a.stats.rounds] == [r.accepted for r in b.stats.rounds]
    assert sum(r.accepted for r in a.stats.rounds) > 0
