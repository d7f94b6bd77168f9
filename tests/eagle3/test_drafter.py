"""The eagle3 drafter in the decode loop: greedy SD = AR greedy (fp32), the draft cache's bookkeeping,
sampled chains."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SamplingConfig, SpecConfig
from specbench.drafters import DRAFTERS
from specbench.drafters.base import DraftState
from specbench.drafters.eagle3.drafter import Eagle3Drafter
from specbench.engine import SpecDecoder
from specbench.verify.base import TorchRandomness

PROMPTS = [[5, 17, 33, 2, 9, 41, 60, 7], [88, 3, 3, 19, 54, 20, 71, 12, 6, 30, 45]]


def _ar(target, prompt, new_tokens):
    return SpecDecoder(target, SpecConfig(drafter=None), max_seq_len=128).generate(prompt, new_tokens).tokens


def _committed_positions_checker(drafter, prompt_len):
    """on_round hook: once a round is committed, the head cache holds exactly the committed positions
    0..cache_len-1 (each once, nothing drafted): all committed tokens but the new anchor."""
    committed = {"len": prompt_len}  # the target cache length at the start of round 1 (prompt; first token = anchor)

    def check(round_no, tree, result):
        committed["len"] += len(result.tokens)
        assert drafter.fed == committed["len"] == drafter.cache.host_lengths[0], round_no

    return check


@pytest.mark.parametrize("budget", [1, 3, 8])
def test_random_head_greedy_equals_ar(tiny8, budget: int) -> None:
    drafter = Eagle3Drafter(tiny8, random_init=True, draft_vocab=64, seed=budget)
    decoder = SpecDecoder(tiny8, SpecConfig(drafter="eagle3", budget=budget), max_seq_len=128, drafter=drafter)
    for prompt in PROMPTS:
        result = decoder.generate(prompt, 40, on_round=_committed_positions_checker(drafter, len(prompt)))
        assert result.tokens == _ar(tiny8, prompt, 40)
        assert all(r.tree_size == budget for r in result.stats.rounds)
        assert drafter.passes == budget  # chain: one head pass per depth


def test_trained_head_greedy_equals_ar_and_accepts(tiny8, trained_tiny) -> None:
    objective, _ = trained_tiny
    drafter = Eagle3Drafter(tiny8, head=objective.head)
    decoder = SpecDecoder(tiny8, SpecConfig(drafter="eagle3", budget=6), max_seq_len=128, drafter=drafter)
    accepted_runs = 0
    for prompt in PROMPTS + [[1, 2, 3, 4], [90, 80, 70, 60, 50]]:
        result = decoder.generate(prompt, 48, on_round=_committed_positions_checker(drafter, len(prompt)))
        assert result.tokens == _ar(tiny8, prompt, 48)
        accepted_runs += max(r.accepted for r in result.stats.rounds) >= 2
    assert accepted_runs > 0, "the trained head never had 2 drafts accepted: the multi-entry feed is not exercised"


def test_draft_cache_equals_a_fresh_feed_of_the_committed_sequence(tiny8, trained_tiny) -> None:
    """After a request, the head's cache entries are those of one causal pass over the committed
    sequence with target features: each committed position once, none from drafted hidden states."""
    objective, _ = trained_tiny
    drafter = Eagle3Drafter(tiny8, head=objective.head)
    decoder = SpecDecoder(tiny8, SpecConfig(drafter="eagle3", budget=5), max_seq_len=128, drafter=drafter)
    prompt = PROMPTS[1]
    result = decoder.generate(prompt, 40)
    assert sum(r.accepted for r in result.stats.rounds) > 0
    fed = drafter.fed
    seq = prompt + result.tokens
    fresh = Eagle3Drafter(tiny8, head=objective.head)
    ids = torch.tensor([seq[:fed]])
    prefill = tiny8.forward(ids, torch.arange(fed)[None], tiny8.new_cache(fed), None, fresh.taps)
    state = DraftState(tokens=seq[: fed + 1], prompt_len=fed, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
    fresh.begin(state, prefill, 128)
    with torch.inference_mode():
        fresh.feed_context(state)
    assert fresh.fed == fed == drafter.cache.host_lengths[0]
    torch.testing.assert_close(drafter.cache.k[..., :fed, :], fresh.cache.k[..., :fed, :], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(drafter.cache.v[..., :fed, :], fresh.cache.v[..., :fed, :], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tree, tree_args, budget", [("eagle2", {"top_k": 3, "max_depth": 4}, 10),
                                                      ("eagle2", {"top_k": 10, "max_depth": 8}, 60),
                                                      ("static", {"tree": "default-31"}, 31)])
def test_trees_greedy_equal_ar(tiny8, trained_tiny, tree: str, tree_args: dict, budget: int) -> None:
    objective, _ = trained_tiny
    drafter = Eagle3Drafter(tiny8, head=objective.head)
    spec = SpecConfig(drafter="eagle3", tree=tree, tree_args=tree_args, budget=budget)
    decoder = SpecDecoder(tiny8, spec, max_seq_len=256, drafter=drafter)
    accepted = 0
    for prompt in PROMPTS:
        result = decoder.generate(prompt, 40, on_round=_committed_positions_checker(drafter, len(prompt)))
        assert result.tokens == _ar(tiny8, prompt, 40)
        assert max(r.tree_size for r in result.stats.rounds) <= budget
        accepted += sum(r.accepted for r in result.stats.rounds)
    assert accepted > 0
    if tree == "eagle2":  # one head pass for the context + one per expanded frontier below the root
        assert drafter.passes == min(tree_args["max_depth"], budget)


def test_grown_tree_nodes_are_conditioned_on_their_own_path(tiny8, trained_tiny) -> None:
    """Every frontier row `expand` returns during an eagle2 round equals a chain run of the head along
    that node's root path (tree attention sees exactly the node's ancestors)."""
    objective, _ = trained_tiny
    head = objective.head
    prompt = PROMPTS[1]
    drafter = Eagle3Drafter(tiny8, head=head)
    seen: list[tuple[list[int], torch.Tensor]] = []

    def recording(tree, frontier):
        logp = drafter.expand(tree, frontier)
        for row, node in enumerate(frontier.tolist()):
            seen.append(([tree.tokens[i].item() for i in tree.path_to(node)][1:], logp[row]))
        return logp

    state = _state(tiny8, drafter, prompt)
    with torch.inference_mode():
        drafter.root_logp = drafter.feed_context(state)
        from specbench.trees import grow_tree

        tree = grow_tree(_policy("eagle2", top_k=3, max_depth=4), state.anchor, recording, 20, 20)
    assert tree.max_depth == 4 and len(seen) == 1 + 3 * 3
    for path, logp in seen:
        chain = Eagle3Drafter(tiny8, head=head)
        st = _state(tiny8, chain, prompt)
        with torch.inference_mode():
            expected = chain.to_target_logp(chain.feed_context(st))
            parent = torch.zeros(1, dtype=torch.long)
            for depth, tok in enumerate(path, start=1):
                parent, lp = chain.run_nodes(torch.tensor([tok]), parent, depth)
                expected = chain.to_target_logp(lp[0])
        torch.testing.assert_close(logp, expected, rtol=1e-4, atol=1e-5)


def test_greedy_chain_loop_equals_chain_grow(tiny8, trained_tiny) -> None:
    """The direct (sync-free) greedy chain is the tree `chain.grow` would build."""
    from specbench.trees import grow_tree

    objective, _ = trained_tiny
    prompt = PROMPTS[0]
    a, b = Eagle3Drafter(tiny8, head=objective.head), Eagle3Drafter(tiny8, head=objective.head)
    with torch.inference_mode():
        direct = a.draft(_state(tiny8, a, prompt), _policy("chain"), 7)
        sb = _state(tiny8, b, prompt)
        b.root_logp = b.feed_context(sb)
        grown = grow_tree(_policy("chain"), sb.anchor, b.expand, 7, 7)
    assert direct.tokens.tolist() == grown.tokens.tolist()
    torch.testing.assert_close(direct.scores, grown.scores)


def test_sampled_chain_records_its_draft_law(tiny8) -> None:
    drafter = Eagle3Drafter(tiny8, random_init=True, draft_vocab=40, seed=1)
    prompt = PROMPTS[0]
    prefill = tiny8.forward(torch.tensor([prompt]), torch.arange(len(prompt))[None], tiny8.new_cache(16), None, drafter.taps)
    sampling = SamplingConfig(temperature=0.8, top_k=10)
    state = DraftState(tokens=prompt + [3], prompt_len=len(prompt), sampling=sampling, draft_rng=TorchRandomness(4),
                       want_draft_probs=True)
    drafter.begin(state, prefill, 64)
    with torch.inference_mode():
        tree = drafter.draft(state, _policy("chain"), 5)
    tree.validate()
    probs = tree.draft_probs
    assert probs is not None and probs.shape == (6, tiny8.config.vocab_size)
    torch.testing.assert_close(probs[1:].sum(-1), torch.ones(5))
    outside = torch.ones(tiny8.config.vocab_size, dtype=torch.bool)
    outside[drafter.head.d2t] = False
    assert not probs[:, outside].any(), "draft mass outside the draft vocabulary"
    assert bool((probs[1:] > 0).sum(-1).le(10).all()), "top_k=10 not applied to the draft law"
    tokens = tree.tokens[1:]
    assert bool((probs[torch.arange(1, 6), tokens] > 0).all()), "a drafted token has zero draft probability"


def test_missing_shipped_head_is_a_clear_error(tiny8) -> None:
    from specbench.drafters.heads.checkpoint import HeadCheckpointError

    with pytest.raises(HeadCheckpointError, match=r"specbench train --drafter eagle3 .*--data DATA_DIR.*random_init"):
        Eagle3Drafter(tiny8)


def test_registered_under_eagle3() -> None:
    assert DRAFTERS.get("eagle3") is Eagle3Drafter


SMOL_PROMPTS = ["What are three tips for sleeping better?", "Write a Python function that reverses a string.",
                "A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have?"]


def _smollm2_case(smollm2, tree: str, tree_args: dict, budget: int, prompts: list[str], new_tokens: int) -> None:
    drafter = Eagle3Drafter(smollm2, random_init=True, draft_vocab=4096)
    spec = SpecConfig(drafter="eagle3", tree=tree, tree_args=tree_args, budget=budget)
    decoder = SpecDecoder(smollm2, spec, max_seq_len=512, drafter=drafter)
    ar = SpecDecoder(smollm2, SpecConfig(drafter=None), max_seq_len=512)
    for text in prompts:
        prompt = smollm2.encode_chat(text)
        result = decoder.generate(prompt, new_tokens, on_round=_committed_positions_checker(drafter, len(prompt)))
        assert result.tokens == ar.generate(prompt, new_tokens).tokens, f"{tree} diverged from AR on {text!r}"


@pytest.mark.parametrize("tree, tree_args", [("chain", {}), ("eagle2", {"top_k": 4, "max_depth": 3})])
def test_random_head_on_smollm2_greedy_equals_ar(smollm2, tree: str, tree_args: dict) -> None:
    """fp32 real target, untrained head (exactness does not depend on the weights)."""
    _smollm2_case(smollm2, tree, tree_args, 4, SMOL_PROMPTS[:1], 12)


@pytest.mark.slow
@pytest.mark.parametrize("tree, tree_args, budget", [("chain", {}, 8), ("eagle2", {}, 60), ("static", {"tree": "default-31"}, 31)])
def test_random_head_on_smollm2_greedy_equals_ar_long(smollm2, tree: str, tree_args: dict, budget: int) -> None:
    _smollm2_case(smollm2, tree, tree_args, budget, SMOL_PROMPTS, 64)


def _policy(name: str, **args):
    from specbench.trees import TREE_POLICIES

    return TREE_POLICIES.build(name, **args)


def _state(target, drafter, prompt: list[int]) -> DraftState:
    """Prefill `prompt` (its last token is the anchor) and begin a request on `drafter`."""
    n = len(prompt) - 1
    prefill = target.forward(torch.tensor([prompt[:n]]), torch.arange(n)[None], target.new_cache(n), None, drafter.taps)
    state = DraftState(tokens=list(prompt), prompt_len=n, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
    drafter.begin(state, prefill, 128)
    return state


@pytest.mark.parametrize("tree, budget", [pytest.param("eagle2", 12, marks=pytest.mark.slow),  # 33 s on CI's CPU
                                          ("chain", 4)])
def test_triton_head_attention_drafts_what_sdpa_drafts(tree: str, budget: int) -> None:
    """With the target on the Triton attention backend (interpreted on the CPU) the head's passes read
    the committed entries and this round's rows through the kernel, not SDPA over the whole cache: the
    same trees round by round, and greedy SD still emits the AR tokens."""
    from targets import tiny_target

    pytest.importorskip("triton")
    trees = {}
    for backend in ("sdpa", "triton"):
        target = tiny_target()
        target.model.set_attention(backend)
        drafter = Eagle3Drafter(target, random_init=True, draft_vocab=64, seed=4)
        decoder = SpecDecoder(target, SpecConfig(drafter="eagle3", tree=tree, budget=budget), max_seq_len=96,
                              drafter=drafter)
        seen = []
        result = decoder.generate(PROMPTS[1], 20, on_round=lambda i, t, r: seen.append((t.tokens.tolist(),
                                                                                       t.parents.tolist())))
        assert result.tokens == _ar(target, PROMPTS[1], 20)
        trees[backend] = seen
    assert trees["triton"] == trees["sdpa"]


@pytest.mark.parametrize("draft_vocab, top_k", [(40, 4), (6, 8)])
def test_draft_vocabulary_topk_grows_the_full_vocabulary_tree(tiny8, draft_vocab: int, top_k: int) -> None:
    """eagle2 grown through the top-k over the draft vocabulary (`expand_ranked`, what `draft` uses) is
    the tree grown from `expand`'s full-vocabulary rows, node for node (a d2t of spread-out ids; top_k
    above the draft vocabulary takes the full rows' -inf ids too). Pairs of equal LM-head rows tie."""
    from specbench.drafters.eagle3.drafter import _RankedExpand
    from specbench.trees.grow import grow_tree

    drafter = Eagle3Drafter(tiny8, random_init=True, draft_vocab=draft_vocab, seed=3)
    vocab = tiny8.config.vocab_size
    drafter.head.set_draft_vocab(torch.linspace(1, vocab - 1, draft_vocab).long())
    with torch.no_grad():
        weight = drafter.head.lm_head.weight
        weight.copy_(weight[torch.arange(draft_vocab) // 2 * 2])  # draft ids 2i and 2i + 1: equal log-probs
    policy = _policy("eagle2", top_k=top_k, max_depth=4)
    trees = []
    for expand in (_RankedExpand(drafter), drafter.expand):
        state = _state(tiny8, drafter, PROMPTS[1])
        drafter.feed_context(state)
        tree = grow_tree(policy, state.anchor, expand, 12, 12)
        trees.append((tree.tokens.tolist(), tree.parents.tolist(), tree.depth.tolist(), tree.scores.tolist()))
    assert trees[0] == trees[1]
