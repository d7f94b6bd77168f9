"""The decoder's `triton` attention backend: same logits as `sdpa`, and greedy SD still equals AR."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import rel_err  # noqa: E402

from specbench.config import SpecConfig  # noqa: E402
from specbench.engine import SpecDecoder, ar_decoder  # noqa: E402
from specbench.models import load_target  # noqa: E402
from specbench.trees.base import DraftTree  # noqa: E402


def _prefill_then_tree(target, prompt_len: int, batch: int = 1, cache_len: int = 96):
    """Logits of a prefill and of a tree verify pass after it (rows of the batch at different lengths)."""
    g = torch.Generator().manual_seed(0)
    dev = target.device
    vocab = target.config.vocab_size
    cache = target.new_cache(cache_len, batch=batch)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(dev)
    pre = target.forward(ids, torch.arange(prompt_len, device=dev).expand(batch, -1), cache, kv_len=prompt_len).logits
    for row in range(batch):
        cache.advance(prompt_len - row, row)  # row r keeps only prompt_len - r tokens
    tree = DraftTree.from_paths(5, [[3, 9, 4], [3, 1], [8, 2, 2, 5], [8, 6]], device=dev)
    n = tree.num_nodes
    lengths = cache.lengths[:, None]
    out = target.forward(tree.tokens.expand(batch, -1), lengths + tree.depth, cache,
                         tree.ancestor_mask.expand(batch, n, n), kv_len=prompt_len + n).logits
    return pre, out


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_triton_logits_equal_sdpa(device, preset) -> None:
    sdpa = load_target(f"random:{preset}@1", device=device, dtype="float32")
    triton_target = load_target(f"random:{preset}@1", device=device, dtype="float32", attention="triton")
    for batch in (1, 2):
        ref_pre, ref_tree = _prefill_then_tree(sdpa, 37, batch)
        got_pre, got_tree = _prefill_then_tree(triton_target, 37, batch)
        assert rel_err(got_pre, ref_pre) <= 1e-5
        assert rel_err(got_tree, ref_tree) <= 1e-5


@pytest.mark.parametrize("backend", ["triton-merge", "triton-split-merge"])
def test_split_merge_backends_equal_sdpa(device, backend) -> None:
    """Both places of the split merge, over a prefix long enough that the plan splits it."""
    from specbench.kernels.tree_attention import plan_attention

    prompt = 300
    target = load_target("random:tiny-llama@1", device=device, dtype="float32", attention=backend)
    cfg = target.config
    group = cfg.num_heads // cfg.num_kv_heads
    assert plan_attention(1, cfg.num_kv_heads, group, 11, prompt, torch.device(device), torch.float32).num_splits > 1
    sdpa = load_target("random:tiny-llama@1", device=device, dtype="float32")
    ref_pre, ref_tree = _prefill_then_tree(sdpa, prompt, 1, cache_len=320)
    got_pre, got_tree = _prefill_then_tree(target, prompt, 1, cache_len=320)
    assert rel_err(got_pre, ref_pre) <= 1e-5
    assert rel_err(got_tree, ref_tree) <= 1e-5


def _greedy_sd_equals_ar(target, budget: int) -> int:
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (12,), generator=g).tolist() * 2  # repeats: ngram drafts
    ar = ar_decoder(target, max_seq_len=256).generate(prompt, 40).tokens
    result = SpecDecoder(target, SpecConfig(drafter="ngram", budget=budget), max_seq_len=256).generate(prompt, 40)
    assert result.tokens == ar
    return sum(r.accepted for r in result.stats.rounds)


def test_greedy_sd_equals_ar_tiny(device) -> None:
    target = load_target("random:tiny-llama@1", device=device, dtype="float32", attention="triton")
    assert _greedy_sd_equals_ar(target, budget=8) > 0, "no draft accepted: the test would not exercise verification"


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "smollm2-135m-shape"])
@pytest.mark.parametrize("budget", [4, 16])
@pytest.mark.parametrize("backend", ["triton", "triton-decode"])
def test_greedy_sd_equals_ar_on_gpu(cuda, preset, budget, backend) -> None:
    target = load_target(f"random:{preset}@1", device=cuda, dtype="float32", attention=backend)
    assert _greedy_sd_equals_ar(target, budget) > 0, "no draft accepted: the test would not exercise verification"
    sdpa = load_target(f"random:{preset}@1", device=cuda, dtype="float32")
    ref_pre, ref_tree = _prefill_then_tree(sdpa, 37, 2)
    got_pre, got_tree = _prefill_then_tree(target, 37, 2)
    assert rel_err(got_pre, ref_pre) <= 1e-5 and rel_err(got_tree, ref_tree) <= 1e-5


def _ar_step_logits(target, prompt_len: int, steps: int, batch: int = 2) -> torch.Tensor:
    """Logits of `steps` one-node forwards after a prefill (rows at different lengths): the AR step."""
    g = torch.Generator().manual_seed(1)
    dev = target.device
    cache = target.new_cache(prompt_len + steps + 8, batch=batch)
    ids = torch.randint(0, target.config.vocab_size, (batch, prompt_len), generator=g).to(dev)
    target.forward(ids, torch.arange(prompt_len, device=dev).expand(batch, -1), cache, kv_len=prompt_len)
    for row in range(batch):
        cache.advance(prompt_len - 3 * row, row)
    one = torch.ones(batch, 1, 1, dtype=torch.bool, device=dev)
    out = []
    for _ in range(steps):
        tok = torch.randint(0, target.config.vocab_size, (batch, 1), generator=g).to(dev)
        out.append(target.forward(tok, cache.lengths[:, None], cache, one, kv_len=cache.max_seq_len).logits)
        for row in range(batch):
            cache.advance(1, row)
    return torch.stack(out)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_decode_backend_equals_sdpa_and_ar(device, preset) -> None:
    """`triton-decode`: its one-node steps give SDPA's logits over the whole cache, and greedy SD on it equals AR."""
    target = load_target(f"random:{preset}@1", device=device, dtype="float32", attention="triton-decode")
    sdpa = load_target(f"random:{preset}@1", device=device, dtype="float32")
    assert rel_err(_ar_step_logits(target, 70, 3), _ar_step_logits(sdpa, 70, 3)) <= 1e-5
    assert _greedy_sd_equals_ar(target, budget=8) > 0
