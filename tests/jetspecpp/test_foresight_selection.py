"""Foresight's selection rules and calibration, pure tensors: outcome scores are exactly the outcome law
of `outcomes.py` (trees with duplicate siblings included); top-B is the brute-force top-B of that law;
the threshold keeps what reaches λ; SSD fan-out apportions B over depths by ratio^d (Sainte-Laguë) to
each node's best non-child tokens; RowStats rebuilds tempered rows exactly; the per-depth temperature
fit recovers a known miscalibration, and on held-out recorded rounds the calibrated scores are more
reliable (lower outcome NLL, lower calibration error) than the raw ones."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specbench.bench.hit_rate import calibration_error, evaluate, fit_calibration, hit, outcome_nll, selection
from specbench.drafters.jetspecpp.calibration import GRID, RowTemperature
from specbench.drafters.jetspecpp.outcomes import tree_outcome_distribution
from specbench.drafters.jetspecpp.selection import RowLaw, RowStats, draft_rows, select
from specbench.drafters.jetspecpp.speculation import RoundRecord
from specbench.trees.base import DraftTree


def random_tree(rng: random.Random, n: int, vocab: int) -> DraftTree:
    parents, tokens, depth = [-1], [rng.randrange(vocab)], [0]
    for v in range(1, n):
        p = rng.randrange(v)
        parents.append(p)
        depth.append(depth[p] + 1)
        siblings = [tokens[c] for c in range(1, v) if parents[c] == p]
        tokens.append(siblings[0] if siblings and rng.random() < 0.3 else rng.randrange(vocab))  # duplicates too
    return DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents), depth=torch.tensor(depth))


def chain(drafts: list[int]) -> DraftTree:
    return DraftTree.chain(0, drafts)


@pytest.mark.parametrize("seed", range(6))
def test_scores_are_the_outcome_law_and_top_b_is_its_top_b(seed: int) -> None:
    rng = random.Random(seed)
    vocab, n = 7, rng.randrange(2, 9)
    tree = random_tree(rng, n, vocab)
    logp = torch.log_softmax(torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2, -1)
    want = tree_outcome_distribution(tree.host[1], tree.host[0], logp.exp())  # [N, V]
    law = RowLaw.from_logp(logp, tree.tokens, tree.parents, vocab)
    for B in (1, 3, 8, n * vocab):
        sel = select("top", law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, B)
        got = {(int(u), int(a)): math.exp(float(s)) for u, a, s, ok in zip(sel.nodes, sel.tokens, sel.score, sel.valid) if ok}
        ranked = sorted(((float(want[u, a]), (u, a)) for u in range(n) for a in range(vocab) if want[u, a] > 0), reverse=True)
        assert set(got) == {o for _, o in ranked[:B]}
        for o, p in got.items():
            assert p == pytest.approx(float(want[o]), abs=1e-12)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)  # B = N V: every outcome, once
    # a row's top K >= B + children suffices: the compressed law selects the same outcomes
    small = RowLaw.from_logp(logp, tree.tokens, tree.parents, 3 + n)
    a = select("top", small, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, 3)
    b = select("top", law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, 3)
    assert torch.equal(a.nodes, b.nodes) and torch.equal(a.tokens, b.tokens)


def test_threshold_keeps_the_top_outcomes_reaching_lambda() -> None:
    tree = chain([1, 2, 3])
    logp = torch.log_softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3, -1)
    law = RowLaw.from_logp(logp, tree.tokens, tree.parents, 6)
    top = select("top", law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, 10)
    thr = select("threshold", law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, 10, lam=0.05)
    assert torch.equal(top.nodes, thr.nodes) and torch.equal(top.tokens, thr.tokens)
    assert torch.equal(thr.valid, top.valid & (top.score.exp() >= 0.05))
    assert 0 < int(thr.valid.sum()) < 10
    with pytest.raises(ValueError, match="lam"):
        select("threshold", law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, 4)


@pytest.mark.parametrize("ratio,B", [(0.5, 16), (0.7, 8), (1.0, 12)])
def test_ssd_fanout_apportions_b_geometrically_over_depths(ratio: float, B: int) -> None:
    drafts = [4, 5, 6, 7, 8]
    tree = chain(drafts)
    logp = torch.log_softmax(torch.randn(6, 20, generator=torch.Generator().manual_seed(2), dtype=torch.float64), -1)
    law = RowLaw.from_logp(logp, tree.tokens, tree.parents, 20)
    sel = select("ssd", law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, B, ratio=ratio)
    assert bool(sel.valid.all())
    counts = [int((sel.nodes == d).sum()) for d in range(6)]
    # Sainte-Laguë with weights ratio^d: seat r of depth d has quotient ratio^d / (2r + 1)
    quotients = sorted(((ratio ** d / (2 * r + 1), d) for d in range(6) for r in range(B)), reverse=True)[:B]
    assert counts == [sum(1 for _, d in quotients if d == k) for k in range(6)]
    for d in range(6):  # each depth's slots are its best tokens other than the next draft
        row = logp[d].clone()
        if d < 5:
            row[drafts[d]] = -math.inf
        best = row.topk(counts[d]).indices.tolist() if counts[d] else []
        assert sorted(int(t) for t, u in zip(sel.tokens, sel.nodes) if u == d) == sorted(best)


def test_row_stats_rebuild_tempered_rows_and_draft_rows_end_uniform() -> None:
    tree = random_tree(random.Random(3), 6, 9)
    z = torch.randn(6, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 4
    stats = RowStats.from_logits(z, tree.tokens, tree.parents, 9, GRID)
    beta = GRID[torch.tensor([30, 32, 20, 40, 32, 8])]
    law = stats.law(stats.column_of(beta), tree.parents)
    want = RowLaw.from_logp(torch.log_softmax(z * beta[:, None], -1), tree.tokens, tree.parents, 9)
    dense = torch.full((6, 9), -math.inf, dtype=torch.float64).scatter(1, law.ids, law.logp)
    torch.testing.assert_close(dense, torch.log_softmax(z * beta[:, None], -1), atol=1e-12, rtol=0)
    torch.testing.assert_close(law.child_logp, want.child_logp, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="grid"):
        stats.column_of(torch.full((6,), 0.3, dtype=torch.float64))
    rows = draft_rows(torch.log_softmax(torch.randn(2, 9, dtype=torch.float64), -1), torch.tensor([0, 1, 2, 3]))
    assert torch.equal(rows[2], torch.full((9,), -math.log(9), dtype=torch.float64)) and torch.equal(rows[2], rows[3])


# ---- calibration ---------------------------------------------------------------------------------
def synthetic_rounds(count: int, seed: int, overconfidence: float, vocab: int = 12, gamma: int = 4) -> list[RoundRecord]:
    """Chains whose decoder logits are `overconfidence` x the true rows' logits; the verified outcome
    is drawn from the outcome law of the true rows."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        z = torch.randn(gamma + 1, vocab, generator=g, dtype=torch.float64) * 2.0  # the true rows' logits
        p = torch.softmax(z, -1)
        drafts = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(gamma)]
        tree = chain(drafts)
        law = tree_outcome_distribution(tree.host[1], tree.host[0], p).flatten()
        u, a = divmod(int(torch.multinomial(law, 1, generator=g)), vocab)
        dec = z * overconfidence
        k = min(vocab, 16 + tree.num_nodes)
        out.append(RoundRecord(tokens=tree.host[0], parents=tree.host[1], depth=tree.host[2],
                               decoder=RowStats.from_logits(dec, tree.tokens, tree.parents, k, GRID),
                               draft=RowLaw.from_logp(torch.log_softmax(z, -1), tree.tokens, tree.parents, k),
                               node=u, bonus=a, bonus_logit=float(dec[u, a]), in_selection=False))
    return out


def test_the_fit_recovers_a_known_miscalibration() -> None:
    cal = fit_calibration(synthetic_rounds(1200, seed=0, overconfidence=2.5), min_rows=150)
    for beta in cal.betas:
        assert abs(math.log2(beta * 2.5)) <= 0.25, cal.betas  # 1/2.5 within two grid steps
    assert RowTemperature.fit(torch.zeros(40, dtype=torch.long), torch.zeros(40), torch.zeros(40, GRID.numel())).betas


def test_calibrated_scores_are_more_reliable_on_held_out_rounds(tmp_path) -> None:
    train, test = synthetic_rounds(300, seed=1, overconfidence=3.0), synthetic_rounds(300, seed=2, overconfidence=3.0)
    cal = fit_calibration(train)
    raw = sum(outcome_nll(r, None) for r in test) / len(test)
    fitted = sum(outcome_nll(r, cal) for r in test) / len(test)
    assert fitted < raw - 0.3, (raw, fitted)
    assert calibration_error([(r, cal) for r in test]) < 0.5 * calibration_error([(r, None) for r in test])
    path = tmp_path / "cal.json"
    cal.save(path)
    assert RowTemperature.load(path) == cal
    with pytest.raises(ValueError, match="not a calibration file"):
        RowTemperature.load(tmp_path / "missing.json")


def test_offline_hits_match_a_brute_force_top_b_and_evaluate_reports_every_rule() -> None:
    rounds = synthetic_rounds(40, seed=3, overconfidence=1.0)
    for rec in rounds[:10]:
        p = _dense_probs(rec)  # the full vocabulary is kept (12 tokens)
        order = p.flatten().argsort(descending=True).tolist()
        rank = order.index(rec.node * p.shape[1] + rec.bonus)
        for B in (1, 4, 8):
            assert hit(rec, selection(rec, "uncalibrated", B, None)) == (rank < B)
    rows, reliability, cals = evaluate([("a", rounds[:20]), ("b", rounds[20:])], Bs=(1, 4), folds=2, min_rows=8)
    assert {(r["dataset"], r["rule"], r["B"]) for r in rows} == {(d, rule, B) for d in "ab" for rule in
                                                                  ("calibrated", "uncalibrated", "threshold", "draft", "ssd", "ssd-decoder") for B in (1, 4)}
    assert all(0 <= r["hit_rate"] <= 1 and r["rounds"] == 20 for r in rows)
    assert len(cals) == 2 and {r["dataset"] for r in reliability} == {"a", "b"}


def _dense_probs(rec: RoundRecord) -> torch.Tensor:
    """The record's raw decoder rows as a dense outcome law [N, V] (entries below the kept top-K are 0)."""
    law = rec.decoder.law(torch.full((len(rec.tokens),), int((GRID == 1.0).nonzero())), torch.tensor(rec.parents))
    rows = torch.zeros(len(rec.tokens), int(law.ids.max()) + 1, dtype=torch.float64)
    rows.scatter_(1, law.ids, law.logp.exp())
    return tree_outcome_distribution(rec.parents, rec.tokens, rows)
