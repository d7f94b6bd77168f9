"""ms per round of jetspec++'s host round vs its device round (CUDA graphs), beside AR and dflash, on
random weights of a preset shape: per-round timing only (random weights accept nothing, so every round
drafts and verifies the full tree), greedy, the median of 3 requests after a warm-up request.

    python scripts/jetspecpp_round.py smollm2-135m-shape cuda 128 [check]

`check` then decodes in fp32 with jetspec++ (device and host round, foresight off and on, chain/16 and
ddtree/64, two requests: the second replays the first's graphs) and prints whether each equals AR's
greedy tokens. "pipelined device" is foresight in the device round (its foresight stage on a second
stream; side:foresight is that stage's own span there, its exposed part is the "foresight" stage);
"pipelined host" the host round's foresight. Random weights accept nothing, so every pipelined round
is a miss: this times the miss branch (draft + verify + the exposed foresight), not a hit's.
"""
import statistics
import sys
import time

import torch

from specbench.config import SpecConfig
from specbench.drafters.heads.parallel import DFlashDrafter
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder
from specbench.models import load_target

preset, device = sys.argv[1], sys.argv[2]
new = int(sys.argv[3]) if len(sys.argv) > 3 else 128
dtype = "bfloat16" if device == "cuda" else "float32"
target = load_target(f"random:{preset}", device=device, dtype=dtype)
g = torch.Generator().manual_seed(0)
MAXLEN = min(1024, target.config.max_position_embeddings)
prompt = torch.randint(0, target.config.vocab_size, (32,), generator=g).tolist()


def sync() -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(label: str, make) -> None:  # type: ignore[no-untyped-def]
    dec = make()
    dec.generate(prompt, 32)  # warm-up: the eager first round and the graph captures
    rows = []
    for _ in range(3):
        sync()
        t = time.perf_counter()
        r = dec.generate(prompt, new)
        sync()
        wall = time.perf_counter() - t
        st = r.stats
        stages: dict[str, list[float]] = {}
        for rd in st.rounds:
            for k, v in rd.times.items():
                stages.setdefault(k, []).append(v)
            if rd.side_time is not None:  # the foresight stage's own span on its stream (not on the critical path)
                stages.setdefault("side:foresight", []).append(rd.side_time)
        rows.append((st.decode_time / max(1, len(st.rounds)) * 1e3, st.tau, wall,
                     {k: 1e3 * statistics.mean(v) for k, v in stages.items()}))
    ms, tau, wall, stages = sorted(rows, key=lambda x: x[0])[1]
    print(f"{label:<34} round {ms:7.3f} ms  tau {tau:5.2f}  " + "  ".join(f"{k} {v:.3f}" for k, v in stages.items()), flush=True)


measure("ar", lambda: SpecDecoder(target, SpecConfig(), max_seq_len=MAXLEN))
for tree, budget in (("chain", 16), ("ddtree", 64)):
    measure(f"dflash/{tree}/{budget}", lambda: SpecDecoder(
        target, SpecConfig(drafter="dflash", tree=tree, budget=budget), max_seq_len=MAXLEN,
        drafter=DFlashDrafter(target, random_init=True)))
    for host in (True, False):
        for J, R in ((1, 1), (0, 0)):
            label = f"jetspec++ {'host' if host else 'device'} J{J}R{R}/{tree}/{budget}"
            try:
                measure(label, lambda: SpecDecoder(
                    target, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=MAXLEN,
                    drafter=JetSpecPPDrafter(target, random_init=True, J=J, R=R, host=host)))
            except Exception as exc:  # report and go on: one call measures all
                print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    for host in (True, False):  # pipelined: foresight B=16 beside the verify forward (random weights: every round misses)
        label = f"jetspec++ pipelined {'host' if host else 'device'} J1R1 B16/{tree}/{budget}"
        try:
            measure(label, lambda: SpecDecoder(
                target, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=MAXLEN,
                drafter=JetSpecPPDrafter(target, random_init=True, J=1, R=1, foresight="on", B=16, host=host)))
        except Exception as exc:
            print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)

if len(sys.argv) > 4 and sys.argv[4] == "check":  # greedy identity in fp32: graphed device round == AR
    t32 = load_target(f"random:{preset}", device=device, dtype="float32")
    ar = SpecDecoder(t32, SpecConfig(), max_seq_len=MAXLEN).generate(prompt, 96).tokens
    for tree, budget in (("chain", 16), ("ddtree", 64)):
        for host in (False, True):
            for foresight in ("off", "on"):
                drafter = JetSpecPPDrafter(t32, random_init=True, J=1, R=1, host=host, foresight=foresight, B=16)
                dec = SpecDecoder(t32, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=MAXLEN,
                                  drafter=drafter)
                outs = [dec.generate(prompt, 96).tokens for _ in range(2)]  # the second request replays the graphs
                print(f"fp32 jetspec++ {'host' if host else 'device'} foresight={foresight} {tree}/{budget} "
                      f"(branching={dec.branching}): == AR {[o == ar for o in outs]}", flush=True)
