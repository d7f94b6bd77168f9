"""The jetspec++ drafter in the real decode loop (fp32): greedy SD emits exactly the AR greedy tokens at
every (J, R, replacement, states) setting and tree policy; a refresh without replacement drafts what no
refresh drafts; anchor replacement writes the decoder's token at depth k̂+1; checkpoints (jetspec++
and plain jetspec heads) load; bad arguments are refused."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters import DRAFTERS
from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder

from jetspecpp_helpers import GRID, NEW, PROMPTS, begun, random_parts



def drafter_from(tiny, trained_jpp, **kw) -> JetSpecPPDrafter:
    obj, _ = trained_jpp
    return JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, **kw)


@pytest.mark.parametrize("J,R,replace", GRID)
def test_greedy_sd_equals_ar_at_every_setting(tiny, trained_jpp, ar_tokens, J: int, R: int, replace: bool) -> None:
    drafter = drafter_from(tiny, trained_jpp, J=J, R=R, replace=replace)
    for tree, budget in (("chain", 5), ("ddtree", 8)):
        decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=160,
                              drafter=drafter)
        accepted = 0
        for prompt, want in zip(PROMPTS, ar_tokens):
            result = decoder.generate(prompt, NEW)
            assert result.tokens == want, f"J{J} R{R} replace={replace} {tree}/{budget} diverged from AR greedy"
            accepted += sum(r.accepted for r in result.stats.rounds)
        assert accepted > 0, "no draft was ever accepted: the commit paths were not exercised"


@pytest.mark.parametrize("states", ["stale", "true"])
@pytest.mark.parametrize("tree", ["chain", "accum-logp"])
def test_greedy_sd_equals_ar_with_state_ablations(tiny, trained_jpp, ar_tokens, states: str, tree: str) -> None:
    drafter = drafter_from(tiny, trained_jpp, J=2, R=2, states=states)
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree=tree, budget=8), max_seq_len=160, drafter=drafter)
    assert [decoder.generate(p, NEW).tokens for p in PROMPTS] == ar_tokens


def trees_of(tiny, drafter, prompt) -> list[list[int]]:  # type: ignore[no-untyped-def]
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="ddtree", budget=8), max_seq_len=160, drafter=drafter)
    seen: list[list[int]] = []
    decoder.generate(prompt, NEW, on_round=lambda i, tree, res: seen.append(tree.tokens.tolist() + tree.parents.tolist()))
    return seen


def test_refresh_without_replacement_drafts_what_no_refresh_drafts(tiny, trained_jpp) -> None:
    for prompt in PROMPTS:
        plain = trees_of(tiny, drafter_from(tiny, trained_jpp, J=2, R=0), prompt)
        refreshed = trees_of(tiny, drafter_from(tiny, trained_jpp, J=2, R=2, replace=False), prompt)
        assert plain == refreshed


def test_anchor_replacement_writes_the_decoder_token(tiny, trained_jpp) -> None:
    """refresh(): k̂ = agreement length of the decoder's top-1 with the drafts; replacement puts the
    decoder's token at depth k̂+1 and leaves every other depth alone."""
    drafter = drafter_from(tiny, trained_jpp, J=1, R=1)
    state = begun(tiny, drafter, PROMPTS[1], 7)
    changed = 0
    for seed in range(12):
        drafts = torch.randint(tiny.config.vocab_size, (drafter.block_size - 1,), generator=torch.Generator().manual_seed(seed))
        tokens = torch.cat([torch.tensor([7]), drafts])
        b = tokens.numel()
        top1 = drafter.decoder_logits(state, tokens, torch.arange(b), block_pattern(b, "block-causal")).argmax(-1)[:-1]
        new, k_hat = drafter.refresh(state, drafts)
        k = int(k_hat)
        assert all(top1[i] == drafts[i] for i in range(k)) and (k == b - 1 or top1[k] != drafts[k])
        want = drafts.clone()
        if k < b - 1:
            want[k] = top1[k]
            changed += 1
        assert torch.equal(new, want)
    assert changed > 0


def test_checkpoints_load_and_plain_jetspec_heads_refine(tiny, trained_jpp) -> None:
    from specbench.drafters.heads.checkpoint import save_head

    obj, directory = trained_jpp
    drafter = DRAFTERS.build("jetspec++", tiny, checkpoint=str(directory), J=2, R=1)
    assert drafter.adapter is not None and drafter.head.config.drafter == "jetspec++"
    for name, p in obj.draft.state_dict().items():
        torch.testing.assert_close(drafter.head.state_dict()[name], p)
    # a plain jetspec head runs the refinement passes without an adapter (Table 12), not the refresh
    plain, _ = random_parts(tiny)
    plain_dir = directory.parent / "plain-jetspec"
    cfg = plain.config.to_dict()
    cfg["drafter"] = "jetspec"
    save_head(plain_dir, plain, cfg, tiny, storage="fp32")
    d = JetSpecPPDrafter(tiny, checkpoint=str(plain_dir), J=3, R=0)
    assert d.adapter is None
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="chain", budget=4), max_seq_len=96, drafter=d)
    assert len(decoder.generate(PROMPTS[0], 8).tokens) == 8
    with pytest.raises(ValueError, match="needs a state adapter"):
        JetSpecPPDrafter(tiny, checkpoint=str(plain_dir), J=1, R=1)
    JetSpecPPDrafter(tiny, checkpoint=str(plain_dir), J=1, R=1, states="true")  # the oracle needs no adapter


def test_bad_arguments_are_refused(tiny) -> None:
    head, adapter = random_parts(tiny)
    with pytest.raises(ValueError, match="R .context refreshes"):
        JetSpecPPDrafter(tiny, head=head, adapter=adapter, J=1, R=2)
    with pytest.raises(ValueError, match="J .Jacobi"):
        JetSpecPPDrafter(tiny, head=head, adapter=adapter, J=-1, R=0)
    with pytest.raises(ValueError, match="states must be"):
        JetSpecPPDrafter(tiny, head=head, adapter=adapter, states="oracle")
    _, other = random_parts(tiny, taps=(1,))
    with pytest.raises(ValueError, match="adapter predicts taps"):
        JetSpecPPDrafter(tiny, head=head, adapter=other)
    from specbench.drafters.heads.checkpoint import HeadCheckpointError

    with pytest.raises(HeadCheckpointError, match="specbench train --drafter jetspec\\+\\+"):
        JetSpecPPDrafter(tiny)


def test_bidirectional_head_runs_its_own_pattern(tiny, ar_tokens) -> None:
    """The Table 15 ablation: a bidirectional head drafts with its own pattern (greedy still exact)."""
    head, adapter = random_parts(tiny, attention="bidirectional")
    drafter = JetSpecPPDrafter(tiny, head=head, adapter=adapter, J=2, R=1)
    assert drafter.attention == "bidirectional"
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="ddtree", budget=6), max_seq_len=160, drafter=drafter)
    assert [decoder.generate(p, NEW).tokens for p in PROMPTS] == ar_tokens


@pytest.mark.parametrize("tree, args, budget", [("static", {"tree": "default-31"}, 31), ("ddtree-vec", {}, 10),
                                                 ("fanout-cap", {}, 10), ("eagle2", {}, 10)])
def test_every_tree_policy(tiny, trained_jpp, ar_tokens, tree: str, args: dict, budget: int) -> None:
    """The refined per-depth scores feed any policy that builds from depth scores, as jetspec's do."""
    drafter = drafter_from(tiny, trained_jpp, J=2, R=1)
    spec = SpecConfig(drafter="jetspec++", tree=tree, tree_args=args, budget=budget)
    decoder = SpecDecoder(tiny, spec, max_seq_len=160, drafter=drafter)
    assert [decoder.generate(p, NEW).tokens for p in PROMPTS] == ar_tokens
