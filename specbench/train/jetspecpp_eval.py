"""Held-out metrics of the jetspec++ state adapter and training-free decoder (JetSpec++ Tables 7, 9).

On held-out sequences (prompt + the target's own response), blocks of b true tokens at random response
anchors a (a + b <= length): per tapped layer l, the adapter's states h_hat^l_{a+j} (from h^l_{<a}
and the block's tokens) against the target's h^l_{a+j}: err = mean |h_hat - h| / |h| and cos = mean
cosine similarity, also per block offset j; beside them the same numbers for the stale predictor
(h^l_{a-1} copied into every position) as a floor. The decoder reads the predicted top-tap states
against the verified context's upper-layer K/V: top-1 agreement of p_hat with the target's greedy
token at each block row, and KL(p || p_hat); `true_*` is the decoder on the true states (a check of
the decoder itself: agreement 1, KL ~ 0 up to float error).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from specbench.drafters.heads.masks import block_pattern, uniform_blocks_mask
from specbench.drafters.jetspecpp.adapter import StateAdapter
from specbench.drafters.jetspecpp.decoder import SliceDecoder
from specbench.models.target import TargetModel
from specbench.train.jetspecpp_objective import state_errors
from specbench.train.regen import TrainingSequence
from specbench.train.sequences import TokenStore
from specbench.train.trainer import SequenceBatches, target_batch


def _anchors(prompt_len: int, length: int, block: int, count: int, g: torch.Generator) -> list[int]:
    """Up to `count` distinct anchors a in [prompt_len, length - block], ascending."""
    lo, hi = prompt_len, length - block
    if hi < lo:
        return []
    cand = torch.arange(lo, hi + 1)
    pick = torch.randperm(cand.numel(), generator=g)[:count]
    return sorted(cand[pick].tolist())


def _kl(logp: Tensor, logq: Tensor) -> Tensor:
    """KL(p || q) per row from log-probs [..., V] (fp64)."""
    p = logp.double()
    return (p.exp() * (p - logq.double())).sum(-1)


@torch.no_grad()
def evaluate_states(target: TargetModel, adapter: StateAdapter, sequences: TokenStore | Sequence[TrainingSequence],
                    anchors_per_seq: int = 8, batch_size: int = 4, max_len: int = 1024, seed: int = 0) -> dict[str, Any]:
    """The metrics above over `sequences` (held out from training). Runs in the adapter's dtype."""
    taps = tuple(adapter.config.taps)
    top = max(taps)
    b = adapter.config.block_size
    model = target.model
    dev = target.device
    g = torch.Generator().manual_seed(seed)
    store = sequences if isinstance(sequences, TokenStore) else TokenStore.from_sequences(list(sequences))
    usable = torch.nonzero(store.response_lengths() >= b + 1)[:, 0].tolist()
    data = SequenceBatches(store, batch_size, max_len, seed) if usable else None
    prompt_lengths = store.prompt_lengths().tolist()
    sums: dict[str, Tensor] = {}
    blocks = 0
    dec = {"top1": 0.0, "kl": 0.0, "true_top1": 0.0, "true_kl": 0.0, "rows": 0}
    decoder: SliceDecoder | None = None
    for start in range(0, len(usable), batch_size):
        seqs = usable[start: start + batch_size]  # store indices
        tokens, valid, loss_mask = data.collate(seqs, dev)  # type: ignore[union-attr]
        batch = target_batch(target, tokens, valid, loss_mask, taps)
        B, T = tokens.shape
        lengths = valid.sum(1).tolist()
        per = [_anchors(prompt_lengths[s], lengths[i], b, anchors_per_seq, g) for i, s in enumerate(seqs)]
        G = max((len(a) for a in per), default=0)
        if G == 0:
            continue
        anchors = torch.zeros(B, G, dtype=torch.long)
        keep = torch.zeros(B, G, dtype=torch.bool)
        for i, a in enumerate(per):
            anchors[i, : len(a)] = torch.tensor(a, dtype=torch.long)
            keep[i, : len(a)] = True
        anchors, keep = anchors.to(dev), keep.to(dev)
        pos = anchors[..., None] + torch.arange(b, device=dev)  # [B, G, b]
        block_tokens = tokens.gather(1, pos.view(B, -1))
        mask = uniform_blocks_mask(anchors, b, "block-causal", T)
        ctx_pos = torch.arange(T, device=dev)[None].expand(B, T)
        d = target.config.hidden_size
        at = pos.view(B, -1)[..., None].expand(B, G * b, d)
        predicted: dict[int, Tensor] = {}
        for t in taps:
            m = adapter.tap(t)
            states = batch.hidden[t]
            pred = m(block_tokens, pos.view(B, -1), m.context_kv(states, ctx_pos, model), mask, model).view(B, G, b, d)
            true = states.gather(1, at).view(B, G, b, d)
            stale = states.gather(1, (anchors - 1)[..., None].expand(B, G, d))[:, :, None].expand(B, G, b, d)
            predicted[t] = pred
            for kind, guess in (("pred", pred), ("stale", stale)):
                rel2, cos = state_errors(guess, true)
                for name, v in ((f"{t}/{kind}_err", rel2.sqrt()), (f"{t}/{kind}_cos", cos)):
                    sums[name] = sums.get(name, torch.zeros(b, dtype=torch.float64)) + v[keep].double().sum(0).cpu()
        blocks += int(keep.sum())
        # The decoder, per sequence: upper-layer K/V of the true context, then each block (latest
        # anchor first, so every read finds the slots below its anchor untouched).
        for i in range(B):
            if decoder is None or decoder.cache.max_seq_len < lengths[i] + b:
                decoder = SliceDecoder(target, top, max(lengths[i] + b, max_len + b))
            decoder.reset()
            decoder.extend(batch.hidden[top][i: i + 1, : lengths[i]])
            depth = torch.arange(b, device=dev)
            causal = block_pattern(b, "block-causal", dev)
            for gi in reversed(range(len(per[i]))):
                a = per[i][gi]
                decoder.truncate(a)
                logp = torch.log_softmax(batch.target_logits[i, a: a + b].double(), -1)  # [b, V]
                greedy = logp.argmax(-1)
                for prefix, h in (("", predicted[top][i, gi][None]), ("true_", batch.hidden[top][i: i + 1, a: a + b])):
                    logq = torch.log_softmax(decoder.read(h, depth, causal).double(), -1)
                    dec[prefix + "top1"] += float((logq.argmax(-1) == greedy).sum())
                    dec[prefix + "kl"] += float(_kl(logp, logq).sum())
                dec["rows"] += b
    out: dict[str, Any] = {"blocks": blocks, "block_size": b, "taps": {}}
    for t in taps:
        row: dict[str, Any] = {}
        for kind in ("pred", "stale"):
            for metric in ("err", "cos"):
                by_offset = (sums[f"{t}/{kind}_{metric}"] / max(blocks, 1)).tolist() if blocks else []
                row[f"{kind}_{metric}"] = sum(by_offset) / len(by_offset) if by_offset else float("nan")
                row[f"{kind}_{metric}_by_offset"] = by_offset
        out["taps"][t] = row
    rows = max(dec["rows"], 1)
    out["decoder"] = {k: (v / rows if k != "rows" else v) for k, v in dec.items()}
    return out
