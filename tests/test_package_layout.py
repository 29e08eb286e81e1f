"""The package's layering: a lower layer never imports a higher one (see DESIGN.md)."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fairseq_headprune"

# Lowest first. Top-level modules errors/io/compat are the base; register imports what registers.
LAYERS = ["errors", "io", "compat", "heads", "data", "model", "pruning", "methods", "register",
          "evaluation", "cli"]


def layer_of(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


def ours(tree):
    """Every ``fairseq_headprune.X`` module imported anywhere in a file (lazy imports included)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fairseq_headprune":
                yield from (f"fairseq_headprune.{a.name}" for a in node.names)
            elif node.module.startswith("fairseq_headprune."):
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("fairseq_headprune."))


FILES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_upward_import(path):
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    me = ".".join(rel.parts)
    mine = layer_of(me)
    upward = [m for m in ours(ast.parse(path.read_text())) if layer_of(m) > mine]
    assert upward == [], f"{me} (layer {LAYERS[mine]}) imports higher layers: {upward}"


def test_every_module_has_a_layer():
    for path in FILES:
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        assert parts[0] in LAYERS, f"{path} is in no layer of {LAYERS}"
