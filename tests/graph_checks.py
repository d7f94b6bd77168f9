"""The graphed-round check the GPU tests share (a module of its own: `conftest` names collide across
folders): a decoder replaying CUDA graphs drafts the eager decoder's trees round by round and emits AR's
tokens."""

from __future__ import annotations

from typing import Any


def trees(decoder: Any, ids: list[int], new: int) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(tokens, every round's (tree tokens, parents)) of one request."""
    seen: list[tuple[list[int], list[int]]] = []
    result = decoder.generate(ids, new, on_round=lambda n, tree, res: seen.append((tree.tokens.tolist(), tree.parents.tolist())))
    return result.tokens, seen


def check_graphed_equals_eager(graphed: Any, eager: Any, prompts: list[list[int]], ar_tokens: list[list[int]],
                               new: int) -> None:
    """Two requests per prompt (the second replays the graphs captured in the first): the same trees
    round by round as the eager decoder's, both = AR; then once with lookahead (no on_round hook)."""
    assert graphed.cuda_graphs and not eager.cuda_graphs
    for ids, want in zip(prompts, ar_tokens, strict=True):
        for _ in range(2):
            g_tokens, g_trees = trees(graphed, ids, new)
            e_tokens, e_trees = trees(eager, ids, new)
            assert g_trees == e_trees, "the graphed round drafted other trees than the eager one"
            assert g_tokens == e_tokens == want, "diverged from AR greedy"
        assert graphed.generate(ids, new).tokens == want
    assert graphed.captured, "the round was never captured"
