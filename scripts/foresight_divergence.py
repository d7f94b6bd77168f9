"""Where jetspec++'s foresight device round first departs from AR and from its eager self, per way of
running it (a diagnostic for the CUDA test `tests/gpu/test_jetspecpp_foresight_device_cuda.py`).

    python scripts/foresight_divergence.py --device cuda [--head DIR] [--out FILE]

Variants (fp32, the real default target, the test's prompts and lengths):
  eager        every stage run eagerly (the foresight stage inline on the main stream)
  graphed-seq  graphed rounds, pipeline=sequential (the foresight stage one more graph of the main chain)
  graphed-conc graphed rounds, the foresight stage replayed on its second stream (the pipelined round)
  graphed-conc-sdpa  graphed-conc with the target (and so the decoder slice's layers) on SDPA attention
Per variant and request: the first token index that differs from AR, the first round whose tree (tokens,
parents) or hit flag differs from the eager variant's, and the hit flags. A variant that raises is
reported with its error. Separating a race (concurrent only), a capture fault (both graphed) and a
kernel backend fault (triton only) is what it is for. (On the H200, 2026-12-02: graphed-conc alone
diverged, with SDPA too, and the same graphs replayed in line did not: a race. Its cause was cuBLAS's
per-stream workspace, shared by graphs captured on one stream: `specbench.models.graphs.SideStage`.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from cuda_cases import MAX_SEQ_LEN, NEW, PROMPTS, trees  # noqa: E402

from specbench.config import SpecConfig  # noqa: E402
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter  # noqa: E402
from specbench.drafters.jetspecpp.model import load_jetspecpp  # noqa: E402
from specbench.engine import SpecDecoder  # noqa: E402
from specbench.models import load_target  # noqa: E402

VARIANTS = ("eager", "graphed-seq", "graphed-conc", "graphed-conc-sdpa")


def first_diff(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_variant(target, name: str, head, adapter, J: int, R: int, B: int, tree: str, budget: int):  # type: ignore[no-untyped-def]
    spec = SpecConfig(drafter="jetspec++", tree=tree, budget=budget)
    pipeline = {"eager": "auto", "graphed-seq": "sequential"}.get(name, "concurrent")
    drafter = JetSpecPPDrafter(target, head=head, adapter=adapter, J=J, R=R, foresight="on", B=B, pipeline=pipeline)
    dec = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, drafter=drafter, cuda_graphs=name != "eager")
    out = []
    for text in PROMPTS:
        for _ in range(2):
            drafter.foresight.clear_log()  # type: ignore[union-attr]
            tokens, seen = trees(dec, target.encode_chat(text))
            out.append({"tokens": tokens, "trees": seen, "hits": [e["hit"] for e in drafter.foresight.log]})  # type: ignore[union-attr]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--head", default="specbench/heads/jetspec++-smollm2-135m", help="a jetspec++ checkpoint directory")
    p.add_argument("--untrained-adapter", action="store_true",
                   help="the CUDA test's other draft model: the shipped jetspec head with an untrained adapter")
    p.add_argument("--cases", default="1,1,16,chain,15;2,1,8,ddtree-vec,24", help="J,R,B,tree,budget;...")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None, help="JSON lines, one per case and variant")
    args = p.parse_args()
    target = load_target(None, device=args.device, dtype="float32")
    if args.untrained_adapter:
        from test_jetspecpp_device_cuda import parts

        head, adapter = parts(target, False)
    else:
        head, adapter = load_jetspecpp(target, args.head)
    ar = SpecDecoder(target, SpecConfig(), max_seq_len=MAX_SEQ_LEN, cuda_graphs=False)
    want = [ar.generate(target.encode_chat(t), NEW).tokens for t in PROMPTS for _ in range(2)]
    sink = open(args.out, "w") if args.out else None
    for case in args.cases.split(";"):
        J, R, B, tree, budget = case.split(",")
        J, R, B, budget = int(J), int(R), int(B), int(budget)
        eager = None
        for name in args.variants.split(","):
            attention = target.model.attention
            if name.endswith("-sdpa"):
                target.model.set_attention("sdpa")
            try:
                got = run_variant(target, name, head, adapter, J, R, B, tree, budget)
                err = None
            except Exception as e:  # noqa: BLE001 - reported, the next variant runs
                got, err = None, f"{type(e).__name__}: {e}"
            finally:
                target.model.set_attention(attention)
            if name == "eager":
                eager = got
            row = {"case": case, "variant": name, "error": err}
            if got is not None:
                row["first_token_diff_vs_ar"] = [first_diff(r["tokens"], w) for r, w in zip(got, want)]
                if eager is not None:
                    row["first_tree_diff_vs_eager"] = [first_diff(r["trees"], e["trees"]) for r, e in zip(got, eager)]
                    row["first_hit_diff_vs_eager"] = [first_diff(r["hits"], e["hits"]) for r, e in zip(got, eager)]
                row["hits"] = ["".join("-" if h is None else "H" if h else "." for h in r["hits"]) for r in got]
            print(json.dumps(row), flush=True)
            if sink:
                sink.write(json.dumps(row) + "\n")
                sink.flush()


if __name__ == "__main__":
    main()
