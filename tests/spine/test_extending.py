"""Adding a component takes one file plus one registration line, and every proof and test that
applies then runs on it by itself.

A toy drafter, tree policy and two verifiers live in a module written to tmp_path (outside
specbench, reached by its dotted path). `--components toy_components` makes pytest import it before
collection (tests/conftest.py), so the registry-driven suites, run in a subprocess, parametrize over
the toy components too: the lossless toy verifier gets the exact-law proofs, the toy policy the tree
invariants, the toy drafter greedy identity under every policy (and every drafter that works with any
policy gets it under the toy policy). A second module declares a lossy rule lossless, and the same
proofs fail on it. In process: the lossy verifier, given by dotted path, is refused without
allow_lossy; components that omit a declaration fail when their class is defined.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from specbench.config import ConfigError, SamplingConfig, SpecConfig
from specbench.drafters.base import Drafter
from specbench.engine import SpecDecoder
from specbench.models import load_target
from specbench.registry import RegistryError
from specbench.trees.base import TreePolicy
from specbench.verify import VERIFIERS
from specbench.verify.base import Verifier

TOY = '''"""Toy components: each is one class and one registration line (the decorator)."""

import torch

from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter
from specbench.trees import TREE_POLICIES
from specbench.trees.base import DraftTree, TreePolicy, check_budget, select_top_scores
from specbench.trees.ranking import f32_add, host_table
from specbench.verify import VERIFIERS
from specbench.verify.base import Verifier, VerifyResult


@DRAFTERS.register("toy-period")
class PeriodDrafter(Drafter):
    """Guesses that the text repeats with period 1, 2 or 3; the guesses form a trie, shallower nodes
    scored higher, and the policy selects from it."""

    name = "toy-period"
    policies = "any"  # it calls select, which every policy has
    taps = ()
    weights = None

    def draft(self, state, policy, budget):
        paths = []
        for period in (1, 2, 3):
            seq = list(state.tokens)
            for _ in range(budget):
                seq.append(seq[-period])
            paths.append(seq[len(state.tokens):])
        trie = DraftTree.from_paths(state.anchor, paths, device=self.target.device)
        trie.scores = -trie.depth.to(torch.float32)  # a child never outscores its parent
        return policy.select(trie, budget)


@TREE_POLICIES.register("toy-beams")
class BeamsPolicy(TreePolicy):
    """`width` chains: chain i starts with the rank-i token of depth 1 and then takes the best token
    of every depth; the `budget` best-scoring nodes are kept."""

    name = "toy-beams"
    can_grow = False

    def __init__(self, width=3):
        self.width = width

    def build(self, scores, budget):
        tok, lp = host_table(*scores.check().topk(min(self.width, scores.vocab_size)))  # [D][k]
        tokens, parents, depth, score = [scores.anchor], [-1], [0], [0.0]
        for i in range(len(tok[0]) if tok else 0):
            parent, total = 0, 0.0
            for d in range(len(tok)):
                rank = i if d == 0 else 0
                total = f32_add(total, lp[d][rank])
                tokens.append(tok[d][rank])
                parents.append(parent)
                depth.append(d + 1)
                score.append(total)
                parent = len(tokens) - 1
        tree = DraftTree.from_lists(tokens, parents, depth, score, scores.logp.device)
        return select_top_scores(tree, check_budget(budget))


@VERIFIERS.register("toy-walk")
class LastMatchWalk(Verifier):
    """Sample y ~ p at each visited node and descend into the last child whose token is y."""

    lossless = True

    def verify_probs(self, tree, target_probs, rng):
        tokens = tree.host[0]
        node, path, out = 0, [0], []
        while True:
            out.append(rng.categorical(target_probs[node]))
            match = [c for c in tree.children[node] if tokens[c] == out[-1]]
            if not match:
                return VerifyResult(path=path, tokens=out)
            node = match[-1]
            path.append(node)


@VERIFIERS.register("toy-accept-first")
class AcceptFirst(Verifier):
    """Accept the first child at every node; the bonus is drawn from p where the walk stops."""

    lossless = False

    def verify_probs(self, tree, target_probs, rng):
        path = [0]
        while tree.children[path[-1]]:
            path.append(tree.children[path[-1]][0])
        tokens = tree.host[0]
        return VerifyResult(path=path, tokens=[tokens[i] for i in path[1:]] + [rng.categorical(target_probs[path[-1]])])
'''

LIAR = '''"""A lossy rule that declares itself lossless: the exact proofs must catch it."""

from toy_components import AcceptFirst

from specbench.verify import VERIFIERS


@VERIFIERS.register("toy-liar")
class Liar(AcceptFirst):
    lossless = True
'''

SUITES = ["tests/verify/test_verify_exact.py", "tests/verify/test_verify_engine.py", "tests/trees/test_trees_invariants.py",
          "tests/trees/test_trees_grow.py", "tests/spine/test_lossless_greedy.py"]


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("toy")
    (directory / "toy_components.py").write_text(TOY)
    (directory / "toy_liar.py").write_text(LIAR)
    return directory


@pytest.fixture(scope="module")
def suite_outcomes(toy_dir: Path) -> dict[str, str]:
    """test id -> passed / failed / skipped, for the registry-driven suites' toy cases (a subprocess
    pytest run with --components; the real-target test is left out, it takes minutes)."""
    repo = Path(__file__).resolve().parents[2]
    report = toy_dir / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_dir), str(repo), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", *SUITES, "--components", "toy_components", "--components", "toy_liar",
           "-k", "toy and not smollm2", "-p", "no:cacheprovider", f"--junitxml={report}", "-q"]
    run = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert report.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcomes[case.get("name")] = ("failed" if kinds & {"failure", "error"} else
                                      "skipped" if "skipped" in kinds else "passed")
    return outcomes


def picked(outcomes: dict[str, str], fragment: str) -> dict[str, str]:
    return {name: result for name, result in outcomes.items() if fragment in name}


def test_the_generic_suites_pick_up_each_toy_component(suite_outcomes: dict[str, str]) -> None:
    walk = picked(suite_outcomes, "toy-walk")
    for suite in ("test_fixed_tree_every_next_token_follows_target", "test_sampled_tree_every_next_token_follows_target",
                  "test_engine_law_of_first_tokens_is_ar_law", "test_no_draft_draws_no_extra_randomness"):
        assert any(name.startswith(suite) for name in walk), f"{suite} did not run on the toy verifier"
    beams = picked(suite_outcomes, "toy-beams")
    assert {"test_policy_invariants[toy-beams{}]", "test_policy_select_keeps_a_scored_subtree[toy-beams{}]"} <= set(beams)
    greedy = {n.partition("[")[2].rpartition("-")[0] for n in suite_outcomes
              if n.startswith("test_greedy_sd_equals_ar_under_every_policy")}  # drafter-policy, budget dropped
    assert {"toy-period-chain", "toy-period-ddtree", "toy-period-toy-beams", "ngram-toy-beams"} <= greedy
    assert "self-toy-beams" not in greedy  # self grows its trees; toy-beams cannot
    assert not any(n.startswith("test_growing_policy") for n in beams)  # toy-beams declares can_grow = False
    assert not any("toy-accept-first" in n for n in suite_outcomes if "law" in n and "agrees" not in n)  # lossy: no proof
    assert "test_engine_refuses_a_lossy_verifier_unless_allowed[toy-accept-first]" in suite_outcomes
    honest = {n: r for n, r in suite_outcomes.items() if "toy-liar" not in n}
    assert honest and all(r == "passed" for r in honest.values()), {n: r for n, r in honest.items() if r != "passed"}


def test_the_proofs_catch_a_lossy_rule_declared_lossless(suite_outcomes: dict[str, str]) -> None:
    liar = picked(suite_outcomes, "toy-liar")
    for suite in ("test_fixed_tree_every_next_token_follows_target", "test_sampled_tree_every_next_token_follows_target"):
        assert liar.get(f"{suite}[toy-liar]") == "failed", liar


def test_a_lossy_verifier_by_dotted_path_is_refused_without_allow_lossy(toy_dir: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(toy_dir))
    target = load_target("random:tiny-llama")
    with pytest.raises(ConfigError, match="not lossless.*allow_lossy"):
        SpecDecoder(target, SpecConfig(verifier="toy_components:AcceptFirst"), max_seq_len=32)
    decoder = SpecDecoder(target, SpecConfig(verifier="toy_components:AcceptFirst", allow_lossy=True), max_seq_len=32)
    assert len(decoder.generate([1, 2, 3], 4, SamplingConfig(temperature=1.0)).tokens) == 4
    with pytest.raises(RegistryError, match="not a subclass of specbench.verify.base.Verifier"):
        VERIFIERS.get("toy_components:PeriodDrafter")


def test_a_component_that_omits_a_declaration_fails_when_defined() -> None:
    with pytest.raises(TypeError, match="lossless = True"):
        class Undeclared(Verifier):
            def verify_probs(self, tree, target_probs, rng):
                raise AssertionError
    with pytest.raises(TypeError, match="can_grow = True"):
        class NoGrowth(TreePolicy):
            def build(self, scores, budget):
                raise AssertionError
    with pytest.raises(TypeError, match="does not override grow"):
        class Boasting(TreePolicy):
            can_grow = True

            def build(self, scores, budget):
                raise AssertionError
    with pytest.raises(TypeError, match="policies = .*taps = .*weights = None"):
        class Bare(Drafter):
            def draft(self, state, policy, budget):
                raise AssertionError
