"""What the GPU tests decode, and the graphed-round check on it (`graph_checks`) they share (a module of its
own: `conftest` names collide across folders)."""

from __future__ import annotations

from typing import Any

import graph_checks

PROMPTS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did she sell altogether?", "Write a Python function that returns the n-th prime."]
NEW = 96  # tokens per request
MAX_SEQ_LEN = 768


def trees(decoder: Any, ids: list[int]) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(tokens, every round's (tree tokens, parents)) of one request of NEW tokens."""
    return graph_checks.trees(decoder, ids, NEW)


def check_graphed_equals_eager(target: Any, graphed: Any, eager: Any, ar_tokens: list[list[int]]) -> None:
    """`graph_checks.check_graphed_equals_eager` on PROMPTS with the chat template, NEW tokens each."""
    prompts = [target.encode_chat(text) for text in PROMPTS]
    graph_checks.check_graphed_equals_eager(graphed, eager, prompts, ar_tokens, NEW)
