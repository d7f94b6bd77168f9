"""Drawing one round's draft tree as a PNG (matplotlib, Agg canvas: no display, no pyplot state).

Layout (no graphviz): depth gives the row (root on top); leaves take consecutive columns in
depth-first order (children by node id) and every parent sits centred over its children, so edges
never cross.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from specbench.trees.base import DraftTree

ACCEPTED = "#d9480f"
DRAFT = "#868e96"


def tree_layout(tree: DraftTree) -> list[tuple[float, float]]:
    """(x, y) per node: y = -depth; leaves at x = 0, 1, 2, ... in depth-first order; a parent at the
    midpoint of its first and last child."""
    children = tree.children
    _, _, depth = tree.host
    x = [0.0] * tree.num_nodes
    next_leaf = 0
    stack = [(0, False)]
    while stack:  # iterative post-order: children placed before their parent
        node, done = stack.pop()
        if not children[node]:
            x[node] = float(next_leaf)
            next_leaf += 1
        elif done:
            x[node] = (x[children[node][0]] + x[children[node][-1]]) / 2
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children[node]))
    return [(x[i], -float(depth[i])) for i in range(tree.num_nodes)]


def check_path(tree: DraftTree, path: Sequence[int]) -> list[int]:
    """`path` as a list of node ids; ValueError unless it starts at the root and follows parent links."""
    _, parents, _ = tree.host
    nodes = [int(n) for n in path]
    if not nodes or nodes[0] != 0:
        raise ValueError(f"accepted_path must start at the root (node 0), got {nodes}")
    for a, b in zip(nodes, nodes[1:]):
        if not 0 <= b < tree.num_nodes or parents[b] != a:
            raise ValueError(f"accepted_path {nodes} is not a root path of the tree: node {b} is not a child of {a}")
    return nodes


def draw_tree(tree: DraftTree, labels: Sequence[str], accepted_path: Sequence[int] | None,
              path_png: str | Path, *, title: str | None = None, bonus: str | None = None,
              dpi: int = 100) -> Path:
    """Write the tree as a PNG: one box per node labelled with its token text, the accepted path
    (node ids from the root, e.g. `VerifyResult.path`) in colour, and `bonus` (the bonus/correction
    token's text) as a dashed box under the last accepted node. Returns the PNG's path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    if len(labels) != tree.num_nodes:
        raise ValueError(f"labels has {len(labels)} entries for {tree.num_nodes} nodes (one per node, root first)")
    accepted = check_path(tree, accepted_path) if accepted_path is not None else []
    on_path = set(accepted)
    xy = tree_layout(tree)
    _, parents, _ = tree.host
    if bonus is not None and accepted:
        last_x, last_y = xy[accepted[-1]]
        xy = xy + [(last_x, last_y - 1.0)]
    width = max(x for x, _ in xy) + 1
    height = -min(y for _, y in xy) + 1
    fig_w = min(max(6.0, 0.55 * width), 160.0)  # inches; capped so huge trees stay < 16k px wide
    fig_h = min(max(3.0, 0.9 * height), 60.0)
    font = max(3.0, min(9.0, 72 * fig_w / width / 6))  # about six characters per leaf column
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.92 if title else 0.98))
    ax.set_axis_off()
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(-height + 0.5, 0.5)
    edges = [(xy[parents[i]], xy[i]) for i in range(1, tree.num_nodes)]
    colours = [ACCEPTED if i in on_path else DRAFT for i in range(1, tree.num_nodes)]
    widths = [2.5 if i in on_path else 0.8 for i in range(1, tree.num_nodes)]
    ax.add_collection(LineCollection(edges, colors=colours, linewidths=widths, zorder=1))
    for i in range(tree.num_nodes):
        face = "#ffd8a8" if i in on_path else ("#e9ecef" if i == 0 else "white")
        ax.text(*xy[i], _printable(labels[i]), ha="center", va="center", fontsize=font, zorder=2,
                parse_math=False, bbox={"boxstyle": "round,pad=0.25", "facecolor": face,
                                        "edgecolor": ACCEPTED if i in on_path else DRAFT})
    if bonus is not None and accepted:
        ax.plot(*zip(xy[accepted[-1]], xy[-1]), color=ACCEPTED, linestyle="--", linewidth=1.5, zorder=1)
        ax.text(*xy[-1], _printable(bonus), ha="center", va="center", fontsize=font, zorder=2, parse_math=False,
                bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": ACCEPTED, "linestyle": "--"})
    if title:
        fig.suptitle(title, fontsize=10)
    out = Path(path_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=dpi)
    return out


def _printable(text: str) -> str:
    """Token text on one visible line: quoted with escapes when it is empty, has outer whitespace or
    control characters (newline tokens, leading-space tokens)."""
    if not text or text != text.strip() or not text.isprintable():
        return repr(text)
    return text
