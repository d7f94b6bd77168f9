"""The import layering, checked by scanning every `import` in specbench (function-level ones too):

    cli, train -> bench -> engine -> {drafters, trees, verify, models} -> kernels

trees/ and verify/ are pure (never models/ or the engine; kernels/ they may use), kernels/ imports
nothing from the rest, and registry/config (and the bare package, for its path) sit below everything
but kernels. train reads bench's exact replay (validation tau); bench/cli.py is a subcommand module of
the `specbench` command and shares its error helpers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import specbench

BASE = {"specbench", "registry", "config"}
BELOW_ENGINE = BASE | {"drafters", "trees", "verify", "models", "kernels", "data", "stats"}
ALLOWED: dict[str, set[str]] = {
    "kernels": set(),
    "specbench": set(),
    "registry": set(),
    "config": set(),
    "stats": set(),
    "trees": BASE | {"kernels"},
    "verify": BASE | {"trees", "kernels"},
    "models": BASE | {"kernels"},
    "data": BASE | {"models"},
    "drafters": BASE | {"models", "trees", "verify", "kernels"},
    "engine": BELOW_ENGINE,
    "train": BELOW_ENGINE | {"engine", "bench"},
    "bench": BELOW_ENGINE | {"engine", "cli"},
    "cli": BELOW_ENGINE | {"engine", "train", "bench"},
}


def group(path: Path, root: Path) -> str:
    """specbench/x.py -> "x"; specbench/pkg/... -> "pkg"; specbench/__init__.py -> "specbench"."""
    parts = path.relative_to(root).with_suffix("").parts
    return "specbench" if parts == ("__init__",) else parts[0]


def imported_groups(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "specbench":
                out.add(parts[1] if len(parts) > 1 else "specbench")
    return out


def test_every_module_imports_only_what_its_layer_allows() -> None:
    root = Path(specbench.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 50
    wrong = []
    for path in files:
        mine = group(path, root)
        assert mine in ALLOWED, f"{path}: no layer is declared for {mine!r}; add it to ALLOWED"
        for other in imported_groups(path) - {mine} - ALLOWED[mine]:
            wrong.append(f"{path.relative_to(root)} imports specbench.{other}")
    assert not wrong, "layering broken:\n" + "\n".join(wrong)


def test_the_scanner_sees_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import torch\n\ndef f():\n    from specbench.engine import SpecDecoder\n    import specbench.models.target\n")
    assert imported_groups(source) == {"engine", "models"}
