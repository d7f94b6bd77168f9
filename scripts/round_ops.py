"""Aten calls and estimated CUDA kernels per round, stage by stage, of the device round
(`SpecDecoder._device_stages`: draft, tree, verify_forward, verify, commit), counted on the CPU with
random weights of a preset shape and a randomly initialised head of the shipped head's shape: the
proxy for the launch-bound GPU round (a kernel in a CUDA graph costs ~3.5-7 us on the H200).

    python scripts/round_ops.py [--preset smollm2-135m-shape] [--configs AR,dflash/ddtree/64,...]

What is counted is the CUDA path (`op_counter`): the kernel count is the aten calls that are not views
or allocations, plus one per Triton launch. Where the CPU runs other code than CUDA, the CPU code gives
the values (not counted) and the CUDA code is run beside it for the count, under TRITON_INTERPRET=1 with
its Triton launches stubbed (counted, not executed): the layer ops (`fused_ops(--level)`: Triton kernels +
cuBLAS), the target's attention (`triton_tree_attention`) and eagle3's draft-row attention
(`context_attention`), a tree's ancestor mask (`ancestor_mask`) and its packing (`pack_tree_mask_kernel`), a scored trie's top nodes (`select_top`), the ranked top-k over a wide row (`ranked_topk_triton`, also where the CPU sorts a draft vocabulary's rows), eagle2's
beam step (`beam_step`), ddtree's build (the
`top_b_tree` kernel: `ddtree` runs as `ddtree-vec`, its CUDA builder, which gives the same tree), ngram's trie
(`ngram_trie`), greedy
acceptance (`tree_accept`) and the K/V commit (`kv_compact`). The split of the attention kernel follows
the interpreter's SM count (4), so a merge launch may be counted where the H200 (132 SMs) has none.
Sizes follow the CPU run (the verify forward reads the filled slots, not the whole cache): they change
no count. Random weights accept nothing, so every round commits one token, as any miss does. What the
count does not see: one aten call may be several CUDA kernels (a sort, a top-k, a cuBLAS split-K) and
kernels differ in cost (the radix top-k over a 49,152-token row is not a 4 us launch); a tree's
ancestor mask, built lazily, is charged to the stage that first reads it (usually the verify forward).

Each stage also lists its "head" part (the draft model's passes: `run_block`, eagle3's `run_nodes` and
`feed`, `write_context`); the rest of a draft stage is the drafter's bookkeeping (eagle3: expanding the
tree depth by depth). The first round (allocations) is not counted.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: the kernels' CUDA path on the CPU

import argparse
import contextlib
import functools
import json
from collections import Counter
from typing import Any, Iterator

import torch

from op_counter import OpCounter, charged, swapped

STAGES = ("draft", "tree", "verify_forward", "verify", "commit")
CONFIGS = "AR,dflash/ddtree/64,jetspec-tree/ddtree/64,eagle3/eagle2/64,ngram/ddtree/64"


class CountingClock:
    """The engine's round clock, also opening a counter part per stage and keeping each round's counts."""

    def __init__(self, inner: Any, counter: OpCounter) -> None:
        self.inner, self.counter = inner, counter
        self.rounds: list[tuple[Counter, Counter, dict]] = []
        self._open: contextlib.ExitStack | None = None

    def _end(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    def start_round(self) -> None:
        self.inner.start_round()
        self.counter.reset()

    def switch(self, name: str) -> None:
        self.inner.switch(name)
        self._end()
        self._open = contextlib.ExitStack()
        self._open.enter_context(self.counter.part(name))

    def close(self) -> None:
        self.inner.close()
        self._end()
        c = self.counter
        self.rounds.append((c.counts.copy(), c.kernels.copy(), {k: v.copy() for k, v in c.names.items()}))

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)


def build_drafter(name: str, target: Any, draft_vocab: int) -> Any:
    from specbench.drafters import DRAFTERS

    if name == "eagle3":
        return DRAFTERS.build(name, target, random_init=True, draft_vocab=draft_vocab)
    if name == "ngram":
        return DRAFTERS.build(name, target, on_device=True, kernel=True)  # the CUDA default: device drafting, one kernel
    from specbench.drafters.heads.parallel import ParallelHeadDrafter

    # the block heads (a DraftHead each) at the shipped depth; jetspec++ builds its own head (an adapter too)
    shipped = shipped_head_config(name) if issubclass(DRAFTERS.get(name), ParallelHeadDrafter) else None
    if shipped is None:
        return DRAFTERS.build(name, target, random_init=True)
    from specbench.drafters.heads.backbone import DraftHead, HeadConfig, default_taps

    layers = target.config.num_layers
    if max(shipped["taps"]) >= layers:  # a smaller preset: as many taps, spread over its layers
        shipped = {**shipped, "taps": list(default_taps(layers, len(shipped["taps"])))}
    head = DraftHead(target.config, HeadConfig.from_dict(shipped)).to(target.device).init_weights(target.model, seed=0)
    return DRAFTERS.build(name, target, head=head)


def shipped_head_config(name: str, target_name: str = "smollm2-135m") -> dict | None:
    """The shipped `name` block head's config (its depth, taps, block), for a random head of its shape;
    None where none ships under that name."""
    from specbench.drafters.heads.checkpoint import CONFIG_FILE, default_head_dir

    path = default_head_dir(name, target_name) / CONFIG_FILE
    return json.loads(path.read_text())["head"] if path.is_file() else None


@contextlib.contextmanager
def cuda_paths(counter: OpCounter, target: Any, policy: Any, level: str) -> Iterator[None]:
    """Every CPU/CUDA divergence of the round shadowed by its CUDA path (module docstring)."""
    from specbench.drafters import ngram
    from specbench.drafters.eagle3 import drafter as eagle3_drafter
    from specbench.kernels.frontier_rows import frontier_rows
    from specbench.kernels.node_inputs import node_inputs
    from specbench.kernels.rescore_tree import rescore_tree
    from specbench.drafters.heads import jetspec_tree
    from specbench.kernels import ngram_trie, reference, tree_attention
    from specbench.kernels.ranked_topk import ranked_topk_triton
    from specbench.models import decoder
    from specbench.models.triton_attention import triton_tree_attention
    from specbench.kernels import masks, pack_bits
    from specbench.kernels.ancestor_mask import ancestor_mask
    from specbench.kernels.pack_bits import pack_tree_mask_kernel
    from specbench.trees import base, ddtree_vec, grow, ranking
    from specbench.verify import vectorised, walk

    model = target.model
    ops = decoder.fused_ops(level)
    ref = decoder.REFERENCE_OPS
    shadow = counter.shadow

    def context_reference(q, ctx_k, ctx_v, lengths, new_k, new_v, bits, scale, *, new_after_context=False,
                          num_new=None, **_: Any):  # type: ignore[no-untyped-def]
        return reference.context_attention_reference(q, ctx_k, ctx_v, lengths, new_k, new_v, bits, scale,
                                                     new_after_context=new_after_context, num_new=num_new,
                                                     dtype=q.dtype)

    sort_ops = ranking.ranked_topk_sorted  # before the swap below

    def sorted_on_cuda(x, k):  # type: ignore[no-untyped-def]
        """Where the CPU sorts a row, CUDA's kernel past `CUDA_SORT_MAX_WIDTH` (eagle3's draft rows)."""
        return ranked_topk_triton(x, k) if x.shape[-1] > ranking.CUDA_SORT_MAX_WIDTH else sort_ops(x, k)

    def ranked_on_cuda(x, k, id_map=None):  # type: ignore[no-untyped-def]
        """`ranking.ranked_topk` on CUDA for eagle3's mapped rows: the id map inside the kernel's launch."""
        if x.shape[-1] > ranking.CUDA_SORT_MAX_WIDTH:
            return ranked_topk_triton(x, min(int(k), x.shape[-1]), id_map=id_map)
        return ranking.ranked_topk(x, k, id_map=id_map)

    pairs: list[tuple[Any, str, Any]] = [
        (model, "ops", decoder.LayerOps(*(shadow(getattr(ref, f), getattr(ops, f)) for f in
                                          ("norm", "qkv_rope", "silu_mul", "add_rmsnorm_linear", "add_rmsnorm_mlp",
                                           "add_rmsnorm_qkv_rope")))),
        (model, "_attend", shadow(decoder.sdpa_attention, triton_tree_attention)),
        (model, "attention", "triton"),  # eagle3 takes its Triton branch (context_attention)
        (tree_attention, "context_attention", shadow(context_reference, tree_attention.context_attention)),
        (ranking, "ranked_topk_checked", shadow(ranking.ranked_topk_checked, ranked_topk_triton)),
        (ranking, "ranked_topk_sorted", shadow(sort_ops, sorted_on_cuda)),
        (grow, "beam_step_ops", shadow(grow.beam_step_ops, grow.beam_step_kernel)),  # eagle2's depth after its top-k
        (eagle3_drafter, "ranked_topk", shadow(ranking.ranked_topk, ranked_on_cuda)),  # d2t in the top-k's launch
        (jetspec_tree, "rescore_tree_ops", shadow(jetspec_tree.rescore_tree_ops, rescore_tree)),  # the re-selection
        (eagle3_drafter, "node_inputs_ops", shadow(eagle3_drafter.node_inputs_ops,  # a head pass's inputs
                                                   lambda *a, norm=None: node_inputs(*a))),
        (eagle3_drafter, "frontier_rows_ops", shadow(eagle3_drafter.frontier_rows_ops, frontier_rows)),  # eagle3's depth before
        (base, "device_ancestor_masks", shadow(base.ancestor_masks, lambda parents, depth: ancestor_mask(parents))),
        (pack_bits, "pack_tree_mask", shadow(masks.pack_tree_mask, pack_tree_mask_kernel)),  # a forward's mask, jetspec++'s flat rows
        (walk, "accept_packed", shadow(functools.partial(vectorised.accept_packed, use_kernel=False),
                                       functools.partial(vectorised.accept_packed, use_kernel=True))),
        (decoder.KVCache, "compact_with_index_ops",
         shadow(decoder.KVCache.compact_with_index_ops, decoder.KVCache.compact_with_kernel)),
    ]
    def trie_reference(history, length, root, max_ngram, min_ngram, max_matches, size):  # type: ignore[no-untyped-def]
        tree, count = ngram.lookup_trie(root, history, length, max_ngram, min_ngram, max_matches, size, kernel=False)
        return tree.tokens, tree.parents, tree.depth, tree.scores, count

    pairs.append((ngram_trie, "ngram_trie", shadow(trie_reference, ngram_trie.ngram_trie)))
    select_ops = base.select_top_scores_ops  # before the swap below

    def select_kernel(candidates, budget):  # type: ignore[no-untyped-def]
        selected = base.select_top_scores_kernel(candidates, budget)  # None where the ops are the faster
        return select_ops(candidates, budget) if selected is None else selected

    pairs.append((base, "select_top_scores_ops", shadow(select_ops, select_kernel)))
    if isinstance(policy, ddtree_vec.DDTreeVecPolicy):
        pairs.append((ddtree_vec, "build_top_b", shadow(ddtree_vec.build_top_b, policy._kernel_build)))
    with swapped(pairs), counter.stubbed_launches():
        yield


def count_config(config: str, preset: str, rounds: int, level: str, draft_vocab: int,
                 dtype: str = "bfloat16") -> dict[str, Any]:
    """Mean per round over `rounds` rounds (after the first) of one drafter/tree/budget ("AR": no drafter):
    {stage: (aten calls, kernels)}, the head parts, the kernels per stage by op (most frequent first)."""
    from specbench.config import SpecConfig
    from specbench.drafters.eagle3.drafter import Eagle3Drafter
    from specbench.drafters.heads.drafter import HeadDrafter
    from specbench.engine import SpecDecoder
    from specbench.models import load_target

    target = load_target(f"random:{preset}", device="cpu", dtype=dtype)
    if config.upper() == "AR":
        name, tree, budget = None, "chain", 1  # the budget is unused without a drafter
    else:
        parts = config.split("/")
        if len(parts) != 3 or not parts[2].isdigit():
            raise SystemExit(f"round_ops: --configs takes AR or DRAFTER/TREE/BUDGET entries, got {config!r}")
        name, tree, budget = parts[0], parts[1], int(parts[2])
    run_tree = "ddtree-vec" if tree == "ddtree" else tree  # ddtree's builder on CUDA (the same tree)
    drafter = build_drafter(name, target, draft_vocab) if name else None
    dec = SpecDecoder(target, SpecConfig(drafter=name, tree=run_tree, budget=budget), max_seq_len=512, drafter=drafter)
    if not dec.device_drafting:
        raise SystemExit(f"{config}: not a device round on the CPU (the drafter drafts on the host)")
    counter = OpCounter()
    clock = CountingClock(dec.clock, counter)
    dec.clock = clock  # type: ignore[assignment]
    head = lambda: f"{counter.parts[-1]}/head"  # noqa: E731
    parts = [(head, HeadDrafter, "run_block"), (head, HeadDrafter, "write_context"),
             (head, Eagle3Drafter, "run_nodes"), (head, Eagle3Drafter, "feed")]
    prompt = torch.randint(0, target.config.vocab_size, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode(), cuda_paths(counter, target, dec.policy, level), charged(counter, parts), counter:
        dec.generate(prompt, 2 + rounds)  # random weights: one token a round
    counted = clock.rounds[1:]
    assert counted, "no round after the first ran"
    keys = set().union(*(c for c, _, _ in counted))
    mean = {k: (sum(c[k] for c, _, _ in counted) / len(counted), sum(r[k] for _, r, _ in counted) / len(counted))
            for k in keys if k is not None}
    names: Counter[tuple[str, str]] = Counter()
    for _, _, n in counted:
        for part, ops in n.items():
            for op, c in ops.items():
                names[(part.split("/")[0] if part else "", op)] += c / len(counted)
    stages = {s: tuple(map(sum, zip(*(v for k, v in mean.items() if k.split("/")[0] == s)))) for s in STAGES}
    stages = {s: v for s, v in stages.items() if v}
    heads = {k.split("/")[0]: v for k, v in mean.items() if k.endswith("/head")}
    return {"config": config, "rounds": len(counted), "stages": stages, "head": heads, "parts": mean,
            "kernels": {s: {op: c for (st, op), c in names.most_common() if st == s} for s in stages}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="smollm2-135m-shape")
    p.add_argument("--configs", default=CONFIGS, help="comma-separated drafter/tree/budget (AR: no drafter)")
    p.add_argument("--rounds", type=int, default=2, help="rounds counted (after the first)")
    p.add_argument("--level", default="elementwise", choices=("elementwise",),
                   help="the CUDA layer-op level counted (the 'gemm' level fuses add+norm and SiLU*up into the "
                        "product after them where timed faster: up to 2 fewer kernels a layer)")
    p.add_argument("--draft-vocab", type=int, default=4096, help="eagle3's draft vocabulary (the shipped head's)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="the weights' dtype (the GPU runs bf16: its casts are kernels that fp32 skips)")
    p.add_argument("--top", action="store_true", help="list each stage's most frequent kernels")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    torch.set_num_threads(1)
    results = [count_config(c, args.preset, args.rounds, args.level, args.draft_vocab, args.dtype)
               for c in args.configs.split(",")]
    print(f"{args.preset} {args.dtype}, layer ops at the {args.level} level: per round, aten calls (CPU) / kernels "
          "(CUDA path)")
    print("| config | " + " | ".join(STAGES) + " | round | non-forward share |")
    print("|---|" + "---:|" * (len(STAGES) + 2))
    for r in results:
        cells = []
        for s in STAGES:
            v = r["stages"].get(s)
            h = r["head"].get(s)
            cells.append("" if v is None else f"{v[0]:.0f} / {v[1]:.0f}" + (f" (head {h[1]:.0f})" if h else ""))
        total = sum(v[1] for v in r["stages"].values())
        fwd = r["stages"].get("verify_forward", (0, 0))[1]
        print(f"| {r['config']} | " + " | ".join(cells) + f" | {total:.0f} | {100 * (total - fwd) / total:.0f} % |")
    print("(head = the draft model's passes within the stage, kernels; non-forward share = the kernels outside "
          "the verify forward)")
    if args.top:
        for r in results:
            for s, ops in r["kernels"].items():
                print(f"  {r['config']} [{s}] " + ", ".join(f"{op} {c:g}" for op, c in list(ops.items())[:10]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
