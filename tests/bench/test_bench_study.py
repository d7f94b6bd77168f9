"""Study files, overrides and plan expansion: malformed input fails at once with a useful message."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbench.bench import DatasetSpec, Grid, Study, StudyError, load_study
from specbench.bench.plan import plan_study
from specbench.drafters import DRAFTERS

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def small_study(**grid: object) -> Study:
    return Study(name="t", grids=(Grid(**grid),), datasets=(DatasetSpec("builtin", n=2),), targets=("random:tiny-llama",))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.py"
    path.write_text(text)
    return path


def test_load_study_file(tmp_path: Path) -> None:
    path = write(tmp_path, "from specbench.bench import *\nSTUDY = Study(name='s', grids=(Grid(drafters=['ngram']),), "
                           "datasets=['builtin'])\n")
    study = load_study(path)
    assert study.name == "s" and study.grids[0].drafters == ("ngram",) and study.datasets == (DatasetSpec("builtin"),)


@pytest.mark.parametrize("text, message", [
    ("STUDY = Study(\n", r"syntax error at line 1"),
    ("x = 1\n", r"defines no STUDY: declare `STUDY = Study\(...\)`"),
    ("STUDY = {'name': 'x'}\n", r"STUDY is a dict, not a specbench.bench.Study"),
    ("import specbench_no_such_module\n", r"failed while loading: ModuleNotFoundError"),
    ("from specbench.bench import *\nSTUDY = Study(name='s', grids=(Grid(budgets=(0,)),), datasets=('builtin',))\n",
     r"budgets must hold integers >= 1"),
    ("from specbench.bench import *\nSTUDY = Study(name='s', grids=(), datasets=('builtin',))\n",
     r"grids must be a non-empty tuple of Grid"),
])
def test_malformed_study_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(StudyError, match=message):
        load_study(write(tmp_path, text))


def test_missing_study_file(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="does not exist"):
        load_study(tmp_path / "nope.py")


def test_overrides() -> None:
    study = small_study(drafters=("ngram",), budgets=(4,)).with_overrides(
        ["budgets=[2,8]", "n=3", "max_new_tokens=16", "drafters=self", "device=cpu", "drafter_args={layers: 1}"])
    grid = study.grids[0]
    assert grid.budgets == (2, 8) and grid.drafters == ("self",) and grid.drafter_args == ({"layers": 1},)
    assert study.datasets[0].n == 3 and study.max_new_tokens == (16,)
    assert study.with_overrides(["datasets=[gsm8k,mbpp]"]).datasets == (DatasetSpec("gsm8k", n=3), DatasetSpec("mbpp", n=3))
    with pytest.raises(StudyError, match=r"unknown override key 'budget'.*grid keys .*budgets"):
        study.with_overrides(["budget=4"])
    with pytest.raises(StudyError, match=r"not of the form key=value"):
        study.with_overrides(["budgets"])
    with pytest.raises(StudyError, match=r"n must be an integer >= 1"):
        study.with_overrides(["n=0"])


def test_plan_adds_ar_baselines_and_skips_incompatible_combinations() -> None:
    plan = plan_study(small_study(drafters=("ngram", "self"), budgets=(2, 4), verifiers=("greedy", "sample-walk"),
                                  temperatures=(0.0, 0.7)))
    labels = [(v.label, v.run.sampling.temperature) for v in plan.variants]
    assert labels[:2] == [("ar", 0.0), ("ar", 0.7)]  # baselines first, one per sampling setting
    assert ("ngram/chain/greedy/b2", 0.7) not in labels and ("ngram/chain/sample-walk/b4", 0.7) in labels
    assert len(labels) == 2 + 2 * 2 * 3  # greedy at T=0.7 dropped
    assert any("'greedy' at T=0.7" in note for note in plan.notes)
    assert len({v.key for v in plan.variants}) == len(plan.variants)


def test_plan_skips_policies_a_drafter_cannot_use_with_its_reason() -> None:
    plan = plan_study(small_study(drafters=("ngram",), trees=("chain", "eagle2")))
    assert [v.label for v in plan.variants] == ["ar", "ngram/chain/greedy/b8"]
    assert any("ngram/eagle2/greedy at T=0.0: drafter 'ngram' cannot draft with tree='eagle2'" in n for n in plan.notes)
    plan = plan_study(small_study(drafters=("dflash",), trees=("chain", "ddtree"), verifiers=("tree-rrs", "sample-walk"),
                                  temperatures=(0.7,), optional=True))
    labels = {v.label for v in plan.variants}
    if "dflash" in DRAFTERS:
        assert {"dflash/chain/tree-rrs/b8", "dflash/ddtree/sample-walk/b8"} <= labels
        assert "dflash/ddtree/tree-rrs/b8" not in labels
        assert any("dflash/ddtree/tree-rrs at T=0.7" in n and "the policies it can then: chain" in n for n in plan.notes)


def test_labels_name_the_arguments_that_tell_variants_apart() -> None:
    """Two variants that differ only in drafter_args or tree_args (the round table's blocks of 8 beside 16) are
    told apart in what --dry-run and the progress bar print."""
    plan = plan_study(small_study(drafters=("ngram",), drafter_args=({}, {"max_ngram": 2}),
                                  tree_args={"top_k": 3}, budgets=(8,)))
    assert [v.label for v in plan.variants] == ["ar", "ngram/chain/greedy/b8 (top_k=3)",
                                                "ngram/chain/greedy/b8 (max_ngram=2, top_k=3)"]


def test_missing_drafter_fails_with_its_name_unless_optional() -> None:
    with pytest.raises(StudyError, match=r"drafter 'no-such-head' is not registered \(registered: .*ngram"):
        plan_study(small_study(drafters=("ngram", "no-such-head")))
    plan = plan_study(small_study(drafters=("ngram", "no-such-head"), optional=True))
    assert [v.label for v in plan.variants] == ["ar", "ngram/chain/greedy/b8"]
    assert any("no-such-head" in note for note in plan.notes)


def test_shipped_experiments_load() -> None:
    names = sorted(p.stem for p in EXPERIMENTS.glob("*.py"))
    assert {"quickstart", "budget_sweep", "attention_ablation", "verifier_compare"} <= set(names)
    for name in names:
        assert load_study(EXPERIMENTS / f"{name}.py").name == name


def test_attention_ablation_names_a_missing_head() -> None:
    study = load_study(EXPERIMENTS / "attention_ablation.py")
    missing = [d for d in ("dflash", "jetspec", "jetspec-tree") if d not in DRAFTERS]
    if not missing:
        pytest.skip("every attention-ablation head is registered")
    with pytest.raises(StudyError, match=rf"drafter '{missing[0]}' is not registered"):
        plan_study(study)


def test_quickstart_runs_every_available_drafter_and_notes_the_rest() -> None:
    plan = plan_study(load_study(EXPERIMENTS / "quickstart.py"))
    drafters = {v.run.spec.drafter for v in plan.variants}
    assert {None, "ngram", "self"} <= drafters
    for name in ("dflash", "jetspec", "jetspec-tree", "eagle3", "jetspec++"):
        assert (name in drafters) or any(f"skipped optional {name} " in note for note in plan.notes)


def test_quickstart_covers_every_drafter_that_ships_a_head() -> None:
    """Found through the registry: a drafter whose head ships for the default target is in the quickstart."""
    from specbench.drafters import DRAFTERS

    study = load_study(EXPERIMENTS / "quickstart.py")
    covered = {d for grid in study.grids for d in grid.drafters}
    shipped = {n for n in DRAFTERS.names() if (w := DRAFTERS.get(n).weights) is not None
               and w.shipped_dir(n, "smollm2-135m").is_dir()}
    assert shipped and shipped <= covered, sorted(shipped - covered)
