"""The context n-gram expert of foresight's outcome scores (`ngram.py`) and its calibration: the dense
levels are a brute-force n-gram lookup; the boosted rows keep the outcome law a distribution (it sums to
1 over outcomes) and a record's compact form rebuilds them exactly; the joint fit recovers known
(beta, eta); cross-fitting never scores a prompt with a calibration fitted on it; calibration files
without etas load as before; records without context stats still load."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from specbench.bench.hit_rate import cross_fit, decoder_law, evaluate, fit_calibration, outcome_nll
from specbench.drafters.jetspecpp.calibration import GRID, RowTemperature
from specbench.drafters.jetspecpp.ngram import ORDERS, ContextStats, boost, tree_levels
from specbench.drafters.jetspecpp.outcomes import tree_outcome_distribution
from specbench.drafters.jetspecpp.selection import RowLaw, RowStats, select
from specbench.drafters.jetspecpp.speculation import RoundRecord
from specbench.trees.base import DraftTree

from test_foresight_selection import random_tree


def brute_levels(context: list[int], tree: DraftTree, orders: int, vocab: int) -> torch.Tensor:
    """level(u, t): 0 if t is not in the context, else 1 + the longest key (<= orders tokens) that
    precedes an occurrence of t."""
    tokens, parents, _ = tree.host
    out = torch.zeros(len(tokens), vocab, dtype=torch.long)
    for u in range(len(tokens)):
        path, v = [], u
        while v > 0:
            path.append(tokens[v])
            v = parents[v]
        seq = context + path[::-1]  # the root is context[-1] (the anchor)
        for j in range(len(context)):
            k = 0
            while k < orders and j - k - 1 >= 0 and context[j - k - 1] == seq[len(seq) - 1 - k]:
                k += 1
            out[u, context[j]] = max(int(out[u, context[j]]), k + 1)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_dense_levels_are_a_brute_force_ngram_lookup(seed: int) -> None:
    rng = random.Random(seed)
    vocab = 5  # few tokens: long matches happen
    tree = random_tree(rng, rng.randrange(1, 9), vocab)
    anchor = int(tree.tokens[0])
    context = [rng.randrange(vocab) for _ in range(rng.randrange(0, 30))] + [anchor, rng.randrange(vocab), anchor]
    buf = torch.tensor(context + [rng.randrange(vocab) for _ in range(7)])  # slots past the anchor are not read
    got = tree_levels(buf, torch.tensor([len(context) - 1]), tree.tokens, tree.depth, tree.ancestor_mask, 3, vocab)
    assert torch.equal(got, brute_levels(context, tree, 3, vocab))
    assert int(got[0].max()) > 1  # the earlier anchor's continuation


def _record(rng: random.Random, vocab: int = 9) -> tuple[RoundRecord, torch.Tensor, torch.Tensor]:
    """A record with context stats, its raw logits [N, V] and token levels [N, V]."""
    tree = random_tree(rng, rng.randrange(2, 8), vocab)
    context = [rng.randrange(4) for _ in range(25)] + [int(tree.tokens[0])]
    levels = tree_levels(torch.tensor(context), torch.tensor([len(context) - 1]), tree.tokens, tree.depth,
                         tree.ancestor_mask, ORDERS, vocab)
    z = torch.randn(tree.num_nodes, vocab, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)),
                    dtype=torch.float64) * 3
    k = min(vocab, 3 + tree.num_nodes)  # a small top-K: the continuations must fill in
    rec = RoundRecord(tokens=tree.host[0], parents=tree.host[1], depth=tree.host[2],
                      decoder=RowStats.from_logits(z, tree.tokens, tree.parents, k, GRID),
                      draft=RowLaw.from_logp(torch.log_softmax(z, -1), tree.tokens, tree.parents, k), node=0,
                      bonus=0, bonus_logit=float(z[0, 0]), in_selection=False, context=ContextStats.from_levels(levels, z))
    return rec, z, levels


@pytest.mark.parametrize("seed", range(4))
def test_boosted_outcome_law_sums_to_one_and_records_rebuild_it(seed: int) -> None:
    rec, z, levels = _record(random.Random(seed))
    cal = RowTemperature((GRID[28].item(), GRID[36].item()), (0.2, 0.7, 2.0, 0.3))
    tree = DraftTree(tokens=torch.tensor(rec.tokens), parents=torch.tensor(rec.parents), depth=torch.tensor(rec.depth))
    rows = (z * cal.beta(tree.depth)[:, None] + boost(levels, torch.tensor(cal.etas, dtype=torch.float64))).log_softmax(-1)
    dense = tree_outcome_distribution(rec.parents, rec.tokens, rows.exp())  # [N, V]
    assert float(dense.sum()) == pytest.approx(1.0, abs=1e-12)
    vocab = z.shape[1]
    full = select("top", RowLaw.from_logp(rows, tree.tokens, tree.parents, vocab), tree.tokens, tree.parents, tree.depth,
                  tree.ancestor_mask, tree.num_nodes * vocab)
    assert math.fsum(math.exp(s) for s, ok in zip(full.score.tolist(), full.valid.tolist()) if ok) == pytest.approx(1.0, abs=1e-12)
    law = decoder_law(rec, cal)  # compact: kept top-K + continuations
    want = RowLaw.from_logp(rows, tree.tokens, tree.parents, law.ids.shape[1])
    torch.testing.assert_close(law.logp, want.logp, atol=1e-12, rtol=0)
    torch.testing.assert_close(law.child_logp, want.child_logp, atol=1e-12, rtol=0)
    B = 3
    a = select("top", law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, B)
    b = select("top", want, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, B)
    assert torch.equal(a.nodes, b.nodes) and torch.equal(a.tokens, b.tokens)
    with pytest.raises(ValueError, match="context stats"):
        decoder_law(RoundRecord(**{**vars(rec), "context": None}), cal)


def test_the_joint_fit_recovers_known_temperatures_and_boosts() -> None:
    """Rows whose labels are drawn from softmax(beta* z + boost(eta*)): the fit finds beta* (on the grid)
    and eta* up to sampling noise."""
    g = torch.Generator().manual_seed(0)
    m, vocab, true_beta, true_eta = 6000, 30, (0.5, 1.41421356), torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    depth = torch.randint(0, 2, (m,), generator=g)
    z = torch.randn(m, vocab, generator=g, dtype=torch.float64) * 2.5
    levels = torch.zeros(m, vocab, dtype=torch.long)
    cand = torch.randint(0, vocab, (m, 4), generator=g)
    levels.scatter_(1, cand, torch.randint(1, 4, (m, 4), generator=g))
    beta = torch.tensor(true_beta, dtype=torch.float64)[depth]
    p = torch.softmax(z * beta[:, None] + boost(levels, true_eta), -1)
    label = torch.multinomial(p, 1, generator=g)[:, 0]
    lse = torch.stack([torch.logsumexp(z * b, -1) for b in GRID.tolist()], -1)  # [M, G]
    top, ids = levels.topk(4, dim=1)
    cal = RowTemperature.fit_ngram(depth, z.gather(1, label[:, None])[:, 0], lse, levels.gather(1, label[:, None])[:, 0],
                                   torch.where(top > 0, z.gather(1, ids), 0.0), top, 3)
    for got, want in zip(cal.betas, true_beta):
        assert abs(math.log2(got / want)) <= 0.126, cal  # within a grid step
    torch.testing.assert_close(torch.tensor(cal.etas, dtype=torch.float64), true_eta, atol=0.2, rtol=0)
    assert min(cal.etas) >= 0


def test_cross_fit_never_scores_a_prompt_with_a_calibration_fitted_on_it() -> None:
    rng = random.Random(7)
    prompts = [(f"d{i % 2}", [_record(rng)[0] for _ in range(3)]) for i in range(5)]
    seen: list[set[int]] = []

    def fit(rounds):  # type: ignore[no-untyped-def]
        seen.append({id(r) for r in rounds})
        return RowTemperature((float(len(seen)),))

    cals = cross_fit(prompts, 3, fit)
    assert len(seen) == 3 and len(cals) == len(prompts)
    for (_, rounds), cal in zip(prompts, cals):
        train = seen[int(cal.betas[0]) - 1]
        assert train and not train & {id(r) for r in rounds}


def test_calibration_files_old_and_new_and_records_without_context(tmp_path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"kind": "per-depth temperature", "betas": [0.84, 1.0]}) + "\n")  # written before etas
    assert RowTemperature.load(old) == RowTemperature((0.84, 1.0)) and RowTemperature.load(old).etas == ()
    RowTemperature((0.84, 1.0)).save(tmp_path / "plain.json")
    assert "etas" not in json.loads((tmp_path / "plain.json").read_text())
    new = RowTemperature((0.84, 1.0), (1.5, 4.0, 0.0))
    new.save(tmp_path / "new.json")
    assert RowTemperature.load(tmp_path / "new.json") == new
    with pytest.raises(ValueError, match="etas"):
        RowTemperature((1.0,), (-0.5,))
    rec = _record(random.Random(3))[0]
    d = rec.to_dict()
    assert RoundRecord.from_dict(d).context is not None
    del d["context"]  # a record written before context stats
    assert RoundRecord.from_dict(d).context is None


def test_evaluate_fits_the_ngram_rule_where_records_have_context() -> None:
    rng = random.Random(11)
    prompts = []
    for i in range(4):
        rounds = []
        for _ in range(10):
            rec, z, levels = _record(rng)
            # the verified bonus: a continuation of the root where there is one (the expert is informative)
            bonus = int(levels[0].argmax()) if int(levels[0].max()) > 0 else int(z[0].argmax())
            kids = {rec.tokens[v] for v in range(len(rec.tokens)) if rec.parents[v] == 0}
            if bonus in kids:
                continue
            rounds.append(RoundRecord(**{**vars(rec), "bonus": bonus, "bonus_logit": float(z[0, bonus])}))
        prompts.append((f"d{i % 2}", rounds))
    rows, reliability, cals = evaluate(prompts, Bs=(1, 4), folds=2, min_rows=4)
    rules = {r["rule"] for r in rows}
    assert "calibrated-ngram" in rules
    assert all(abs(r["hit_rate"] + r["miss_wrong_k"] + r["miss_wrong_anchor"] - 1) < 1e-12 for r in rows)
    assert any(c.etas and max(c.etas) > 0 for c in cals)
    for r in reliability:
        assert r["nll_calibrated_ngram"] < r["nll_calibrated"]
    everything = [r for _, rounds in prompts for r in rounds]
    cal = fit_calibration(everything, min_rows=4, ngram=True)
    assert sum(outcome_nll(r, cal) for r in everything) < sum(outcome_nll(r, fit_calibration(everything, 4)) for r in everything)
