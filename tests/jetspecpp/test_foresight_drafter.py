"""jetspec++ with foresight in the decode loop (fp32, the pipeline run sequentially on the CPU): greedy
SD emits exactly the AR greedy tokens under every state source, tree policy and selection rule, and
blocks are served from the cache; the hand-off runs fork (end of drafting) -> verify forward ->
launch -> join (before observe touches any state); recorded rounds evaluated offline reproduce the
live hits; the draft device, its model copy and the transfers; bad arguments are refused."""

from __future__ import annotations

import pytest
import torch

from specbench.bench.hit_rate import hit, selection
from specbench.config import SpecConfig
from specbench.drafters.jetspecpp.calibration import RowTemperature
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.drafters.jetspecpp.pipeline import Pipeline, target_copy
from specbench.engine import SpecDecoder

from jetspecpp_helpers import NEW, PROMPTS, random_parts

RULES = [{}, {"select": "threshold", "lam": 0.02}, {"select": "ssd"}, {"scores": "draft"}]


def drafter_from(tiny, trained_jpp, **kw) -> JetSpecPPDrafter:  # type: ignore[no-untyped-def]
    obj, _ = trained_jpp
    return JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, **kw)


def hits(drafter: JetSpecPPDrafter) -> list[bool]:
    return [e["hit"] for e in drafter.foresight.log if e["hit"] is not None]


@pytest.mark.parametrize("states", ["predicted", "stale", "true"])
@pytest.mark.parametrize("rule", range(len(RULES)), ids=["top", "threshold", "ssd", "draft-scores"])
def test_greedy_sd_with_foresight_equals_ar(tiny, trained_jpp, ar_tokens, states: str, rule: int) -> None:
    for tree, budget in (("chain", 5), ("ddtree", 8)):
        drafter = drafter_from(tiny, trained_jpp, J=1, R=1, states=states, foresight="on", B=8,
                               calibration=RowTemperature((16.0,)), **RULES[rule])
        decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=160,
                              drafter=drafter)
        for prompt, want in zip(PROMPTS, ar_tokens):
            assert decoder.generate(prompt, NEW).tokens == want, f"{states} {RULES[rule]} {tree}/{budget} diverged from AR"
        served = hits(drafter)
        assert len(served) > 10
        if states == "true" and "scores" not in RULES[rule]:  # exact sharp rows: blocks are served from the cache
            assert any(served)


class RecordingPipeline(Pipeline):
    """Logs the hand-off with the target cache's committed length at each step."""

    def __init__(self, decoder_ref: list, device: torch.device) -> None:  # type: ignore[type-arg]
        super().__init__(device, "sequential")
        self.ref, self.events = decoder_ref, []

    def _mark(self, what: str) -> None:
        self.events.append((what, self.ref[0].cache.host_lengths[0]))

    def fork(self) -> None:
        self._mark("fork")

    def launch(self, fn, *reads):  # type: ignore[no-untyped-def]
        self._mark("launch")
        return fn()

    def join(self) -> None:
        self._mark("join")


def test_hand_off_order_fork_verify_launch_join(tiny, trained_jpp) -> None:
    """The host round's hand-off (the device round's is the engine's `SideStage`)."""
    drafter = drafter_from(tiny, trained_jpp, J=1, R=1, foresight="on", B=4, host=True)
    ref: list = []
    drafter.pipeline = RecordingPipeline(ref, tiny.device)
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="chain", budget=5), max_seq_len=160, drafter=drafter)
    ref.append(decoder)
    decoder.generate(PROMPTS[0], 16)
    ev = drafter.pipeline.events
    names = [e[0] for e in ev]
    assert names[0] == "join"  # begin() joins whatever a previous request left
    rounds = [names[i: i + 3] for i in range(1, len(names), 3)]
    assert rounds and all(r == ["fork", "launch", "join"] for r in rounds), names
    for i in range(1, len(ev), 3):
        (_, at_fork), (_, at_launch), (_, at_join) = ev[i: i + 3]
        assert at_launch > at_fork  # the verify forward (and its commit) came between fork and launch
        assert at_join == at_launch  # observe joined before anything else moved


def test_offline_evaluation_of_recorded_rounds_reproduces_live_hits(tiny, trained_jpp) -> None:
    for args in ({}, {"select": "ssd"}):
        drafter = drafter_from(tiny, trained_jpp, J=1, R=1, states="true", foresight="on", B=3, record=True, **args)
        decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="ddtree", budget=8), max_seq_len=160,
                              drafter=drafter)
        for p in PROMPTS:
            decoder.generate(p, NEW)
        recs = drafter.foresight.records
        rule = "ssd-decoder" if args else "uncalibrated"
        offline = [hit(r, selection(r, rule, 3, None)) for r in recs]
        assert offline == [r.in_selection for r in recs]
        assert 0 < sum(offline) < len(offline)
        # a selected outcome is served in the next round (the last round of a request has no next)
        served = [r.hit for r in recs]
        nxt = [served[i + 1] for i in range(len(recs) - 1) if served[i + 1] is not None]
        prev = [offline[i] for i in range(len(recs) - 1) if served[i + 1] is not None]
        assert nxt == prev


def test_score_mode_drafts_nothing_ahead(tiny, trained_jpp, ar_tokens) -> None:
    drafter = drafter_from(tiny, trained_jpp, J=1, R=1, foresight="score", record=True)
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="chain", budget=5), max_seq_len=160, drafter=drafter)
    assert decoder.generate(PROMPTS[1], NEW).tokens == ar_tokens[1]
    assert hits(drafter) == [] and len(drafter.foresight.records) == len(drafter.foresight.log)


def test_draft_device_copy_and_transfers(tiny, trained_jpp, ar_tokens) -> None:
    copy = target_copy(tiny, torch.device("cpu"))
    assert copy.model is not tiny.model
    mine = {id(p) for p in tiny.model.parameters()}
    assert all(id(p) not in mine and p.data_ptr() != q.data_ptr()
               for p, q in zip(copy.model.parameters(), tiny.model.parameters()))
    ids = torch.tensor([PROMPTS[0]])
    pos = torch.arange(ids.shape[1])[None]
    a = tiny.forward(ids, pos, tiny.new_cache(16), None, (0, 1))
    b = copy.forward(ids, pos, copy.new_cache(16), None, (0, 1))
    assert torch.equal(a.logits, b.logits) and all(torch.equal(a.hidden[t], b.hidden[t]) for t in (0, 1))
    drafter = drafter_from(tiny, trained_jpp, J=1, R=1, foresight="on", draft_device="cpu", pipeline="sequential")
    assert drafter.draft_device == tiny.device and drafter.target is tiny and not drafter.pipeline.concurrent
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="chain", budget=5), max_seq_len=160, drafter=drafter)
    assert decoder.generate(PROMPTS[0], NEW).tokens == ar_tokens[0]
    x = torch.randn(2, 3)
    assert torch.equal(drafter.pipeline.to_draft(x), x)
    host, ready = drafter.pipeline.to_host(x)
    Pipeline.wait_host(ready)
    assert ready is None and torch.equal(host, x)
    with pytest.raises(ValueError, match="pipeline=concurrent needs a CUDA"):
        Pipeline(torch.device("cpu"), "concurrent")


def test_two_device_path_on_one_device(tiny, trained_jpp, ar_tokens) -> None:
    """draft_copy=true: the path of a draft model on its own device (its own weights, explicit transfers, the host
    round), run where both devices are one (issue 17's path on one CPU or one GPU): greedy output equals AR, and it
    drafts the trees the shared-weights host round drafts."""
    trees: dict[bool, list] = {}
    for copy in (True, False):
        drafter = drafter_from(tiny, trained_jpp, J=1, R=1, foresight="on", draft_copy=copy, host=True,
                               pipeline="sequential")
        assert (drafter.target is not tiny) == copy and drafter.separate == copy and not drafter.device_round
        decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="chain", budget=5), max_seq_len=160,
                              drafter=drafter)
        seen: list = []
        result = decoder.generate(PROMPTS[0], NEW, on_round=lambda n, t, r: seen.append(t.tokens.tolist()))
        assert result.tokens == ar_tokens[0]
        trees[copy] = seen
    assert trees[True] == trees[False]
    assert not drafter_from(tiny, trained_jpp, J=1, R=1, foresight="on").separate


def test_bad_foresight_arguments_are_refused(tiny, tmp_path) -> None:
    head, adapter = random_parts(tiny)
    make = lambda **kw: JetSpecPPDrafter(tiny, head=head, adapter=adapter, **kw)  # noqa: E731
    for kw, msg in [({"foresight": "maybe"}, "foresight must be"), ({"foresight": True, "B": 0}, "B .outcomes"),
                    ({"foresight": "on", "select": "best"}, "select must be"),
                    ({"foresight": "on", "scores": "target"}, "scores must be"),
                    ({"foresight": "on", "select": "threshold"}, "lam .the threshold"),
                    ({"foresight": "on", "lam": 0.1}, "lam .the threshold"),
                    ({"foresight": "on", "select": "threshold", "lam": 2.0}, "lam must be"),
                    ({"foresight": "on", "fanout_ratio": 0}, "fanout_ratio"),
                    ({"foresight": "on", "calibration": str(tmp_path / "nope.json")}, "not a calibration file"),
                    ({"foresight": "on", "pipeline": "fast"}, "pipeline must be"),
                    ({"foresight": "on", "draft_copy": "yes"}, "draft_copy .the two-device path")]:
        with pytest.raises(ValueError, match=msg):
            make(**kw)
    with pytest.raises(ValueError, match="no state adapter"):
        JetSpecPPDrafter(tiny, head=head, adapter=None, R=0, foresight="on")
    assert make(foresight=False).foresight is None and make(foresight="on", calibration="none").foresight is not None
