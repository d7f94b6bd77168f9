"""scripts/round_ops.py: the per-stage kernel counts of the device round describe the CUDA path (each
Triton kernel the GPU round launches counted once where it runs, the CPU fallbacks not counted), and
`OpCounter.shadow` returns the CPU path's values while counting the CUDA path's launches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the CUDA path's kernels are stubbed through Triton's interpreter")

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def round_ops():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import round_ops

        yield round_ops
    finally:
        sys.path.remove(str(SCRIPTS))


def test_shadow_returns_the_cpu_values_and_counts_the_cuda_launches(round_ops) -> None:
    from op_counter import OpCounter
    from specbench.kernels.fused import silu_mul

    counter = OpCounter()
    x = torch.randn(3, 8)
    reference = lambda t: torch.nn.functional.silu(t[:, :4]) * t[:, 4:]  # noqa: E731
    fn = counter.shadow(reference, silu_mul)
    with torch.inference_mode(), counter.stubbed_launches(), counter, counter.part("stage"):
        out = fn(x)
    assert torch.equal(out, reference(x))
    assert counter.names["stage"] == {"triton:_silu_mul_kernel": 1}  # the reference's silu and mul: not counted
    assert counter.kernels["stage"] == 1


@pytest.mark.parametrize("config", ["AR", "dflash/ddtree/8", "eagle3/eagle2/8"])
def test_stages_count_each_triton_launch_of_the_cuda_round(round_ops, config: str) -> None:
    r = round_ops.count_config(config, "tiny-llama", 1, "elementwise", 32, dtype="float32")
    layers = 2
    k = r["kernels"]
    assert k["verify_forward"]["triton:_attention_kernel"] == layers
    assert k["verify_forward"]["triton:_rmsnorm_kernel"] == 2 * layers + 1
    assert k["verify_forward"]["linear"] == 4 * layers + 1
    assert k["verify"] == {"argmax": 1, "triton:_tree_accept_kernel": 1}
    assert k["commit"]["triton:_kv_compact_kernel"] == 1
    assert "index_copy_" not in k["commit"]  # the CPU compaction is not counted
    if config.startswith("dflash"):
        assert k["tree"]["triton:_top_b_tree_kernel"] == 1  # ddtree's CUDA builder, one launch
        shipped = round_ops.shipped_head_config("dflash")  # the random head has the shipped head's depth
        assert k["draft"]["triton:_attention_kernel"] == shipped["num_layers"]
    if config.startswith("eagle3"):  # eagle2's depth setting 8, budget 8: 8 frontiers, the root's from the feed
        assert k["draft"]["triton:_attention_kernel"] == 7  # context_attention, one a head pass
        assert r["head"]["draft"][1] > 0 and r["head"]["commit"][1] > 0
    assert r["rounds"] == 1 and all(v[1] > 0 for s, v in r["stages"].items() if s != "draft")


def test_foresight_stage_counts_the_cuda_path_by_part(round_ops) -> None:
    """scripts/foresight_ops.py counts the same CUDA path (the layer ops and attention as their Triton launches)."""
    import foresight_ops

    counts = foresight_ops.count_foresight("tiny-llama", "chain:4", J=1, R=1, B=2, rounds_counted=1, top=0)
    assert {"selection", "blocks", "draft stage"} <= set(counts)
    assert all(kernels > 0 and calls >= kernels for calls, kernels in counts.values())
    cpu = foresight_ops.count_foresight("tiny-llama", "chain:4", J=1, R=1, B=2, rounds_counted=1, top=0,
                                        reference_ops=True)
    assert counts["blocks"][1] < cpu["blocks"][1]  # a fused Triton op is one launch, its reference several calls
