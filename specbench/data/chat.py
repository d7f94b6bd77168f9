"""Token ids of one turn of a benchmark item, as the target sees it.

Text turns go through the target's chat template with the model's own earlier answers as assistant
messages (MT-Bench's second turn follows the model's first answer). Token-id turns are concatenated
as they are (turn 0, answer 0, turn 1, ...), which lets tokenizer-less targets run every dataset path.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from specbench.data.base import DataError, Prompt


class ChatTarget(Protocol):
    name: str
    tokenizer: object | None

    def encode_chat(self, messages: Sequence[dict[str, str]], system: str | None = None) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def turn_prompt_ids(target: ChatTarget, prompt: Prompt, turn: int, answers: Sequence[Sequence[int]]) -> list[int]:
    """Prompt ids for `turn` (0-based) given the model's answers (generated ids) to turns 0..turn-1."""
    if not 0 <= turn < len(prompt.turns):
        raise IndexError(f"prompt {prompt.id!r} has {len(prompt.turns)} turn(s), asked for turn {turn}")
    if len(answers) < turn:
        raise ValueError(f"turn {turn} of prompt {prompt.id!r} needs the answers to the {turn} earlier turn(s)")
    if not prompt.is_text:
        ids: list[int] = []
        for k in range(turn):
            ids += list(prompt.turns[k]) + list(answers[k])  # type: ignore[arg-type]
        return ids + list(prompt.turns[turn])  # type: ignore[arg-type]
    if target.tokenizer is None:
        raise DataError(f"target {target.name!r} has no tokenizer, so it cannot read the text prompt {prompt.id!r}: "
                        f"use a tokenised dataset (jsonl:PATH whose prompt field holds token-id lists) or a real target")
    messages: list[dict[str, str]] = []
    for k in range(turn):
        messages += [{"role": "user", "content": prompt.turns[k]},  # type: ignore[list-item]
                     {"role": "assistant", "content": target.decode(answers[k])}]
    messages.append({"role": "user", "content": prompt.turns[turn]})  # type: ignore[dict-item]
    return target.encode_chat(messages, system=prompt.system)
