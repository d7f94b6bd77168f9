"""The whole SpecDecoder, enumerated exactly: with a tiny random float64 target (vocabulary 5) and a
test-only drafter, the law of the first 4 generated tokens under every registered lossless verifier
equals ancestral sampling's law, computed from plain forward passes of the target.

The randomness is enumerated across the whole loop (prefill token, every drafting draw, every
verification draw, over all rounds): one EnumeratingRandomness serves as both `rng` and `draft_rng`,
and `generate` is re-run once per outcome sequence. Also: seeds, draw counting, lossy refusal.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch
from torch import Tensor

from components import serves_sampling, verifiers
from verify_cases import depths

from specbench.config import ConfigError, SamplingConfig, SpecConfig
from specbench.drafters.base import Drafter, DraftState
from specbench.engine import SpecDecoder
from specbench.models.config import ModelConfig
from specbench.models.loader import build_model
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy
from specbench.verify import VERIFIERS, Randomness, TorchRandomness, ar_law, enumerate_law, law_gap, sample_tree
from specbench.verify.sampling import process_logits

VOCAB = 5
PROMPT = [1, 3, 0]
NEW_TOKENS = 4
TREE = [-1, 0, 0, 1]  # two children at the root, one grandchild
CHAIN = [-1, 0, 1]


def tiny_target(seed: int = 0) -> TargetModel:
    cfg = ModelConfig("llama", VOCAB, 16, 32, 1, 2, 1, 8, max_position_embeddings=64)
    model = build_model(cfg, None, dtype=torch.float64, device="cpu", seed=seed)
    # Sharper attention and a larger attention output so that the whole context (hence the KV cache
    # the engine commits) matters, and logits spread enough to give varied next-token laws.
    for layer in model.layers:
        layer.attn.wqkv.weight.mul_(10.0)
        layer.attn.wo.weight.mul_(50.0)
    model.lm_head.weight.mul_(10.0)
    return TargetModel(name=f"tiny-{seed}", model=model, tokenizer=None, fingerprint="test")


class ArgmaxRandomness(Randomness):
    """Deterministic 'draws': the most probable outcome (lowest id on ties). With sampling without
    replacement it picks the top tokens in order: a deterministic top-k drafter."""

    def bernoulli(self, p: float) -> bool:
        return p >= 0.5

    def categorical(self, probs: Tensor) -> int:
        return int(probs.argmax())


class TableDrafter(Drafter):
    """Draft law = a fixed bigram table on the last token. mode "auto": sample (recording rows) when
    the verifier wants draft probabilities, else deterministic top children; "sample": always sample
    (rows recorded only when wanted); "argmax": always deterministic (point masses)."""

    name = "table"
    policies, taps, weights = "any", (), None

    def __init__(self, target: TargetModel, shape: list[int], mode: str = "auto", replacement: bool = True) -> None:
        super().__init__(target)
        g = torch.Generator().manual_seed(5)
        table = torch.rand(VOCAB, VOCAB, generator=g, dtype=torch.float64)
        table[table < table.topk(2, dim=-1).values[:, -1:]] = 0.0  # two tokens per row: small trees
        self.table = table / table.sum(-1, keepdim=True)
        self.shape, self.mode, self.replacement = shape, mode, replacement

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        law = lambda path: self.table[path[-1] if path else state.anchor]  # noqa: E731
        sample = self.mode == "sample" or (self.mode == "auto" and state.want_draft_probs)
        if sample:
            return sample_tree(state.anchor, law, self.shape, state.draft_rng, self.replacement,
                               record_probs=state.want_draft_probs)
        return sample_tree(state.anchor, law, self.shape, ArgmaxRandomness(), replacement=False, record_probs=False)


@lru_cache(maxsize=None)
def ar_target_law(seed: int, sampling: SamplingConfig) -> dict:
    """Ancestral sampling's law of the first NEW_TOKENS tokens, from plain causal forward passes."""
    target = tiny_target(seed)

    def next_law(path: tuple[int, ...]) -> Tensor:
        ids = torch.tensor([PROMPT + list(path)])
        out = target.forward(ids, torch.arange(ids.shape[1])[None], target.new_cache(32), logits_rows="last")
        return process_logits(out.logits[0, -1], sampling)

    return ar_law(next_law, NEW_TOKENS)


WIDE = [-1, 0, 0]  # two root children (duplicates when drawn with replacement)


def engine_cases() -> list[tuple]:
    """(verifier, temperature, top_k, drafter shape, drafter mode, replacement) for every registered
    lossless verifier, on the shapes and temperatures its declarations admit: drafts sampled with and
    without replacement, drafts chosen deterministically (point masses), and draws at T < 1."""
    out: list[tuple] = []
    for name in verifiers(lossless=True):
        chains = VERIFIERS.get(name).chains_only
        first, last = (CHAIN, CHAIN) if chains else (WIDE, TREE)
        if not serves_sampling(name):
            out += [(name, 0.0, 0, first, "auto", True), (name, 0.0, 0, last, "sample", True)]
            continue
        out += [(name, 1.0, 2, first, "sample", True), (name, 1.0, 2, last, "auto", True),
                (name, 0.8, 2, last, "argmax", True)]
        if not chains:
            out.append((name, 1.0, 2, TREE, "sample", False))
    return out


CASES = engine_cases()

SLOW_CASES = [(n, t, 3, s, m, r) for n, t, _, s, m, r in CASES if t == 1.0 and s is not WIDE]  # top-3 supports: minutes
SAMPLERS = [n for n in verifiers(lossless=True) if serves_sampling(n)]
SHAPES = {tuple(TREE): "tree", tuple(CHAIN): "chain", tuple(WIDE): "wide"}


def case_ids(cases: list[tuple]) -> list[str]:
    return [f"{n}-T{t}-top{k}-{SHAPES[tuple(s)]}-{m}" + ("" if r else "-norepl") for n, t, k, s, m, r in cases]


def check_engine_law(name, temperature, top_k, shape, mode, replacement) -> None:  # type: ignore[no-untyped-def]
    target = tiny_target()
    sampling = SamplingConfig(temperature=temperature, top_k=top_k)
    drafter = TableDrafter(target, shape, mode, replacement)
    decoder = SpecDecoder(target, SpecConfig(drafter="table", verifier=name, budget=len(shape) - 1),
                          drafter=drafter, max_seq_len=32)
    rounds_with_drafts = []

    def run(rng: Randomness) -> tuple[int, ...]:
        res = decoder.generate(PROMPT, NEW_TOKENS, sampling, rng=rng, draft_rng=rng,
                               on_round=lambda i, tree, r: rounds_with_drafts.append(r.accepted_drafts))
        return tuple(res.tokens)

    law = enumerate_law(run)
    assert law_gap(law, ar_target_law(0, sampling)) < 1e-12
    assert max(rounds_with_drafts) == max(depths(shape))  # whole draft paths do get accepted


@pytest.mark.parametrize("name,temperature,top_k,shape,mode,replacement", CASES, ids=case_ids(CASES))
def test_engine_law_of_first_tokens_is_ar_law(name, temperature, top_k, shape, mode, replacement) -> None:
    check_engine_law(name, temperature, top_k, shape, mode, replacement)


@pytest.mark.slow
@pytest.mark.parametrize("name,temperature,top_k,shape,mode,replacement", SLOW_CASES, ids=case_ids(SLOW_CASES))
def test_engine_law_larger_cases(name, temperature, top_k, shape, mode, replacement) -> None:
    check_engine_law(name, temperature, top_k, shape, mode, replacement)


def test_same_seed_same_output_other_seed_other_output() -> None:
    target = tiny_target(1)
    for name in SAMPLERS:
        shape = CHAIN if VERIFIERS.get(name).chains_only else TREE
        decoder = SpecDecoder(target, SpecConfig(drafter="table", verifier=name, budget=len(shape) - 1),
                              drafter=TableDrafter(target, shape), max_seq_len=64)
        runs = [decoder.generate(PROMPT, 30, SamplingConfig(temperature=1.0, seed=s)).tokens for s in (0, 0, 1)]
        assert runs[0] == runs[1] and runs[0] != runs[2], name


class CountingRandomness(TorchRandomness):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.uniforms = 0

    def uniform(self, n: int) -> Tensor:
        self.uniforms += n
        return super().uniform(n)


class NoDraft(Drafter):
    policies, taps, weights = "any", (), None

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        return DraftTree.root_only(state.anchor)


@pytest.mark.parametrize("name", SAMPLERS)
def test_no_draft_draws_no_extra_randomness(name: str) -> None:
    """Without drafts (no drafter, or a drafter that proposes nothing) every verifier draws exactly
    one uniform per token and reproduces plain AR sampling from the same seed."""
    target = tiny_target(2)
    sampling = SamplingConfig(temperature=1.0)
    reference = SpecDecoder(target, SpecConfig(verifier="sample-walk"), max_seq_len=64).generate(
        PROMPT, 25, sampling, rng=TorchRandomness(9))
    for drafter in (None, NoDraft(target)):
        spec = SpecConfig(drafter=None if drafter is None else "none-test", verifier=name, budget=2)
        rng, draft_rng = CountingRandomness(9), CountingRandomness(10)
        got = SpecDecoder(target, spec, drafter=drafter, max_seq_len=64).generate(
            PROMPT, 25, sampling, rng=rng, draft_rng=draft_rng)
        assert got.tokens == reference.tokens
        assert rng.uniforms == 25 and draft_rng.uniforms == 0


@pytest.mark.parametrize("name", verifiers(lossless=False))
def test_engine_refuses_a_lossy_verifier_unless_allowed(name: str) -> None:
    target = tiny_target()
    with pytest.raises(ConfigError, match="not lossless"):
        SpecDecoder(target, SpecConfig(verifier=name), max_seq_len=32)
    decoder = SpecDecoder(target, SpecConfig(verifier=name, allow_lossy=True), max_seq_len=32)
    sampling = SamplingConfig(temperature=1.0 if serves_sampling(name) else 0.0)
    assert len(decoder.generate(PROMPT, 3, sampling).tokens) == 3


def test_engine_exact_check_catches_a_lossy_verifier() -> None:
    target = tiny_target()
    sampling = SamplingConfig(temperature=1.0, top_k=2)
    decoder = SpecDecoder(target, SpecConfig(drafter="table", verifier="argmax-match", budget=2, allow_lossy=True),
                          drafter=TableDrafter(target, CHAIN), max_seq_len=32)
    law = enumerate_law(lambda rng: tuple(decoder.generate(PROMPT, NEW_TOKENS, sampling, rng=rng, draft_rng=rng).tokens))
    assert law_gap(law, ar_target_law(0, sampling)) > 1e-3
