"""Adding a component takes one file plus one registration line, and every proof and test that
applies then runs on it by itself.

The verifier, tree policy and drafter that the README's "Extending" section shows are read from the
README into a module written to tmp_path (outside specbench, reached by its dotted path), beside a
module with a lossy verifier and a lossy rule that declares itself lossless. `--components MODULE`
makes pytest import them before collection (tests/conftest.py), so the registry-driven suites, run
in a subprocess, parametrize over the new components too: the lossless verifier gets the exact-law
proofs, the policy the tree invariants, the drafter greedy identity under every policy (and every
drafter that works with any policy gets it under the new policy); the proofs fail on the liar. In
process: the lossy verifier, given by dotted path, is refused without allow_lossy; components that
omit a declaration fail when their class is defined.
"""

from __future__ import annotations

import os
import re
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

README = Path(__file__).resolve().parents[2] / "README.md"

LOSSY = '''"""A lossy verifier, and a lossy rule that declares itself lossless (the proofs must catch it)."""

from specbench.verify import VERIFIERS
from specbench.verify.base import Verifier, VerifyResult


@VERIFIERS.register("accept-first")
class AcceptFirst(Verifier):
    """Accept the first child at every node; the bonus is drawn from p where the walk stops."""

    lossless = False

    def verify_probs(self, tree, target_probs, rng):
        path = [0]
        while tree.children[path[-1]]:
            path.append(tree.children[path[-1]][0])
        tokens = tree.host[0]
        return VerifyResult(path=path, tokens=[tokens[i] for i in path[1:]] + [rng.categorical(target_probs[path[-1]])])


@VERIFIERS.register("liar")
class Liar(AcceptFirst):
    lossless = True
'''


def readme_components() -> str:
    """The python blocks of the README's "Extending" section, as one module."""
    text = README.read_text()
    section = text[text.index("## Extending"):]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3, "the README's Extending section shows a verifier, a tree policy and a drafter"
    return "\n\n".join(blocks)


NEW = ["last-match", "beams", "period", "accept-first", "liar"]  # the registered names of the new components
SUITES = ["tests/verify/test_verify_exact.py", "tests/verify/test_verify_engine.py", "tests/trees/test_trees_invariants.py",
          "tests/trees/test_trees_grow.py", "tests/spine/test_lossless_greedy.py", "tests/heads/test_replay.py"]


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("toy")
    (directory / "readme_components.py").write_text(readme_components())
    (directory / "lossy_components.py").write_text(LOSSY)
    return directory


@pytest.fixture(scope="module")
def suite_outcomes(toy_dir: Path) -> dict[str, str]:
    """test id -> passed / failed / skipped, for the registry-driven suites' cases of the new components
    (a subprocess pytest run with --components; the real-target test is left out, it takes minutes)."""
    repo = Path(__file__).resolve().parents[2]
    report = toy_dir / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_dir), str(repo), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", *SUITES, "--components", "readme_components", "--components",
           "lossy_components", "-k", f"({' or '.join(NEW)}) and not smollm2", "-p", "no:cacheprovider",
           f"--junitxml={report}", "-q"]
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


def test_the_generic_suites_pick_up_each_new_component(suite_outcomes: dict[str, str]) -> None:
    walk = picked(suite_outcomes, "last-match")
    for suite in ("test_fixed_tree_every_next_token_follows_target", "test_sampled_tree_every_next_token_follows_target",
                  "test_engine_law_of_first_tokens_is_ar_law", "test_no_draft_draws_no_extra_randomness"):
        assert any(name.startswith(suite) for name in walk), f"{suite} did not run on the new verifier"
    beams = picked(suite_outcomes, "beams")
    assert {"test_policy_invariants[beams{}]", "test_policy_select_keeps_a_scored_subtree[beams{}]"} <= set(beams)
    assert not any(n.startswith("test_growing_policy") for n in beams)  # beams declares can_grow = False
    greedy = {n.partition("[")[2].rpartition("-")[0] for n in suite_outcomes
              if n.startswith("test_greedy_sd_equals_ar_under_every_policy")}  # drafter-policy, budget dropped
    assert {"period-chain", "period-ddtree", "period-beams", "dflash-beams"} <= greedy
    assert "self-beams" not in greedy  # self grows its trees; beams cannot
    assert "ngram-beams" not in greedy  # ngram names the policies whose select suits its trie
    replayed = {n.partition("[")[2].rpartition("-")[0] for n in suite_outcomes
                if n.startswith("test_replay_equals_decoding_for_every_drafter")}
    assert replayed == greedy  # exact replay equals the real loop for the same (drafter, policy) pairs
    lossy = picked(suite_outcomes, "accept-first")
    assert set(lossy) == {"test_engine_refuses_a_lossy_verifier_unless_allowed[accept-first]",
                          "test_next_token_gap_agrees_with_ar_law_comparison[accept-first]"}  # no proof for a lossy rule
    honest = {n: r for n, r in suite_outcomes.items() if "liar" not in n}
    assert all(r == "passed" for r in honest.values()), {n: r for n, r in honest.items() if r != "passed"}


def test_the_proofs_catch_a_lossy_rule_declared_lossless(suite_outcomes: dict[str, str]) -> None:
    liar = picked(suite_outcomes, "liar")
    for suite in ("test_fixed_tree_every_next_token_follows_target", "test_sampled_tree_every_next_token_follows_target"):
        assert liar.get(f"{suite}[liar]") == "failed", liar
    assert any(n.startswith("test_engine_law_of_first_tokens_is_ar_law") and r == "failed" for n, r in liar.items())


def test_a_lossy_verifier_by_dotted_path_is_refused_without_allow_lossy(toy_dir: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(toy_dir))
    target = load_target("random:tiny-llama")
    with pytest.raises(ConfigError, match="not lossless.*allow_lossy"):
        SpecDecoder(target, SpecConfig(verifier="lossy_components:AcceptFirst"), max_seq_len=32)
    decoder = SpecDecoder(target, SpecConfig(verifier="lossy_components:AcceptFirst", allow_lossy=True), max_seq_len=32)
    assert len(decoder.generate([1, 2, 3], 4, SamplingConfig(temperature=1.0)).tokens) == 4
    with pytest.raises(RegistryError, match="not a subclass of specbench.verify.base.Verifier"):
        VERIFIERS.get("readme_components:PeriodDrafter")


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
