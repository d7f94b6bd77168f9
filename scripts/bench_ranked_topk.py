"""Time the ranked top-k of wide rows on the GPU: the Triton kernel (`specbench.kernels.ranked_topk`) at a few
chunk sizes, with `tl.topk` and with a full `tl.sort`, against the packed-key path it replaced
(`ranked_topk_keys`: int64 keys + torch.topk) and, for scale, a plain float `torch.topk` (no tie rule).

    python scripts/bench_ranked_topk.py [--out FILE.json]

Rows are log-softmaxed bf16-rounded logits over SmolLM2's 49,152-token vocabulary (ties at every cut);
every variant is first checked equal (ids and values) to the reference on fresh rows. Times are CUDA-graph
replays (`triton.testing.do_bench_cudagraph`, median): what a captured round pays. The shapes are the
round's: ddtree's table at budgets 16/64/256 (15 depths), jetspec-tree's node rows, jetspec++'s decoder rows; and
eagle3's per-depth rows over its 4,096-token draft vocabulary, where the stable sort (`ranked_topk_sorted`, what
CUDA ran on them before `CUDA_SORT_MAX_WIDTH`) is timed too; and rows of 512-2,048 entries, which say where that
width should sit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_variants import measure, report, save  # noqa: E402

SHAPES = [(15, 64, "ddtree/64 table"), (15, 16, "ddtree/16 table"), (15, 256, "ddtree/256 table"),
          (65, 8, "jetspec-tree node rows"), (16, 16, "16 block rows")]
DRAFT_VOCAB = 4096  # eagle3's draft vocabulary: its per-depth rows (the kernel's one-launch path past CUDA_SORT_MAX_WIDTH)
DRAFT_SHAPES = [(1, 10, "eagle3 root row"), (10, 10, "eagle3 frontier rows (eagle2's 10 beams)"),
                (16, 16, "eagle3 16 frontier rows")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    from specbench.kernels.ranked_topk import ranked_topk_triton
    from specbench.trees.ranking import ranked_topk_keys, ranked_topk_sorted

    variants = {"keys+torch.topk (before)": ranked_topk_keys,
                "float torch.topk (no tie rule)": lambda x, k: torch.topk(x, k, dim=-1)}
    for chunk in (1024, 2048, 4096):
        variants[f"triton topk chunk {chunk}"] = lambda x, k, c=chunk: ranked_topk_triton(x, k, chunk=c, use_topk=True)
    variants["triton sort chunk 2048"] = lambda x, k: ranked_topk_triton(x, k, chunk=2048, use_topk=False)
    variants["ranked_topk (default)"] = lambda x, k: ranked_topk_triton(x, k)
    variants["stable sort (ranked_topk_sorted)"] = ranked_topk_sorted
    rows_out = []
    g = torch.Generator().manual_seed(0)
    shapes = [(r, k, what, DRAFT_VOCAB) for r, k, what in DRAFT_SHAPES] + [(r, k, what, args.vocab) for r, k, what in SHAPES]
    shapes += [(10, 10, f"{w}-wide rows", w) for w in (512, 1024, 2048)]
    for rows, k, what, vocab in shapes:
        logits = (4 * torch.randn(rows, vocab, generator=g)).bfloat16().float()
        x = torch.log_softmax(logits, -1).cuda()
        want_vals, want_ids = ranked_topk_keys(x, k)
        line = {"rows": rows, "k": k, "what": what, "vocab": vocab}
        for name, fn in variants.items():
            line[name] = measure(lambda fn=fn: fn(x, k), lambda got, name=name: name.startswith("float") or (
                torch.equal(got[1], want_ids) and torch.equal(got[0], want_vals)))
        rows_out.append(line)
        report(f"[{rows}, {vocab}] k={k} ({what})", line, list(variants))
        save(args.out, rows_out)


if __name__ == "__main__":
    main()
