"""What the GPU tests decode, and the graphed-round check they share (a module of its own: `conftest`
names collide across folders)."""

from __future__ import annotations

from typing import Any

PROMPTS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did she sell altogether?", "Write a Python function that returns the n-th prime."]
NEW = 96  # tokens per request
MAX_SEQ_LEN = 768


def trees(decoder: Any, ids: list[int]) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(tokens, every round's (tree tokens, parents)) of one request."""
    seen: list[tuple[list[int], list[int]]] = []
    result = decoder.generate(ids, NEW, on_round=lambda n, tree, res: seen.append((tree.tokens.tolist(), tree.parents.tolist())))
    return result.tokens, seen


def check_graphed_equals_eager(target: Any, graphed: Any, eager: Any, ar_tokens: list[list[int]]) -> None:
    """Two requests per prompt (the second replays the graphs captured in the first): the same trees
    round by round as the eager decoder's, both = AR; then once with lookahead (no on_round hook)."""
    assert graphed.cuda_graphs and not eager.cuda_graphs
    for text, want in zip(PROMPTS, ar_tokens):
        ids = target.encode_chat(text)
        for _ in range(2):
            g_tokens, g_trees = trees(graphed, ids)
            e_tokens, e_trees = trees(eager, ids)
            assert g_trees == e_trees, "the graphed round drafted other trees than the eager one"
            assert g_tokens == e_tokens == want, "diverged from AR greedy"
        assert graphed.generate(ids, NEW).tokens == want
    assert graphed.captured, "the round was never captured"
