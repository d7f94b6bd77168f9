"""Training sequences held as flat token tensors (a corpus of ~70k sequences as Python lists would
cost gigabytes): prompts stored once, each response pointing at its prompt.

Sequence i = prompts[prompt_of[i]] + responses[i]; `variant[i]` indexes the corpus's sampling
temperatures (0 = the first, greedy in the default corpus).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor


@dataclass
class TrainingSequence:
    """One training sequence: the prompt's ids and the target's response ids (EOS included if reached)."""

    prompt: list[int]
    response: list[int]


def _flat(rows: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """Concatenated int32 tokens [sum len] and offsets [n + 1] int64."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    offsets = torch.zeros(len(rows) + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    tokens = torch.tensor([t for r in rows for t in r], dtype=torch.int32)
    return tokens, offsets


@dataclass
class TokenStore:
    prompt_tokens: Tensor  # [P_tok] int32
    prompt_offsets: Tensor  # [P + 1] int64
    response_tokens: Tensor  # [R_tok] int32
    response_offsets: Tensor  # [S + 1] int64
    prompt_of: Tensor  # [S] int64: the prompt of each sequence
    variant: Tensor  # [S] int64: which sampling setting answered it

    @classmethod
    def from_sequences(cls, sequences: Sequence[TrainingSequence]) -> "TokenStore":
        """One prompt entry per sequence (no sharing): for small in-memory data (regen, tests)."""
        pt, po = _flat([s.prompt for s in sequences])
        rt, ro = _flat([s.response for s in sequences])
        n = len(sequences)
        return cls(pt, po, rt, ro, torch.arange(n), torch.zeros(n, dtype=torch.long))

    @classmethod
    def concat(cls, stores: Sequence["TokenStore"]) -> "TokenStore":
        if not stores:
            raise ValueError("no token stores to concatenate")
        p_base = torch.tensor([0] + [s.num_prompts for s in stores[:-1]]).cumsum(0)
        pt_base = torch.tensor([0] + [int(s.prompt_offsets[-1]) for s in stores[:-1]]).cumsum(0)
        rt_base = torch.tensor([0] + [int(s.response_offsets[-1]) for s in stores[:-1]]).cumsum(0)
        return cls(
            prompt_tokens=torch.cat([s.prompt_tokens for s in stores]),
            prompt_offsets=torch.cat([stores[0].prompt_offsets[:1]]
                                     + [s.prompt_offsets[1:] + b for s, b in zip(stores, pt_base)]),
            response_tokens=torch.cat([s.response_tokens for s in stores]),
            response_offsets=torch.cat([stores[0].response_offsets[:1]]
                                       + [s.response_offsets[1:] + b for s, b in zip(stores, rt_base)]),
            prompt_of=torch.cat([s.prompt_of + b for s, b in zip(stores, p_base)]),
            variant=torch.cat([s.variant for s in stores]))

    def __len__(self) -> int:
        return int(self.prompt_of.numel())

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_offsets.numel()) - 1

    def prompt_ids(self, i: int) -> Tensor:
        p = int(self.prompt_of[i])
        return self.prompt_tokens[self.prompt_offsets[p]: self.prompt_offsets[p + 1]]

    def response_ids(self, i: int) -> Tensor:
        return self.response_tokens[self.response_offsets[i]: self.response_offsets[i + 1]]

    def __getitem__(self, i: int) -> TrainingSequence:
        return TrainingSequence(prompt=self.prompt_ids(i).tolist(), response=self.response_ids(i).tolist())

    def response_lengths(self) -> Tensor:
        return self.response_offsets[1:] - self.response_offsets[:-1]  # [S]

    def prompt_lengths(self) -> Tensor:
        """[S] the prompt length of every sequence."""
        return (self.prompt_offsets[1:] - self.prompt_offsets[:-1])[self.prompt_of]

    def response_counts(self, vocab_size: int) -> Tensor:
        """[V] int64 counts of the response tokens."""
        return torch.bincount(self.response_tokens.long(), minlength=vocab_size)

    def select(self, index: Tensor) -> "TokenStore":
        """The sequences at `index` (prompt tensors shared, not copied)."""
        index = torch.as_tensor(index, dtype=torch.long)
        lengths = self.response_lengths()[index]
        offsets = torch.zeros(index.numel() + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        if index.numel():
            starts = self.response_offsets[index]
            rows = torch.repeat_interleave(starts - offsets[:-1], lengths) + torch.arange(int(offsets[-1]))
            tokens = self.response_tokens[rows]
        else:
            tokens = self.response_tokens[:0]
        return TokenStore(self.prompt_tokens, self.prompt_offsets, tokens, offsets, self.prompt_of[index],
                          self.variant[index])
