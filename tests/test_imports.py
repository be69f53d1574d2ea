"""The package's layering, read from the imports: ``common/`` imports neither backend, neither
backend imports the other, and one module reads the environment."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dsv41"


def _imports(path: Path) -> set[str]:
    """Every module a file imports (``import a.b`` and ``from a.b import c`` give ``a.b``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


@pytest.mark.parametrize(
    "part, forbidden",
    [("common", ("dsv41.nvidia", "dsv41.amd", "dsv41.backends", "dsv41.layer")),
     ("nvidia", ("dsv41.amd",)),
     ("amd", ("dsv41.nvidia",))],
)  # fmt: skip
def test_layers_import_down_only(part: str, forbidden: tuple[str, ...]) -> None:
    bad = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in (PACKAGE / part).rglob("*.py")
        for name in _imports(path)
        if name.startswith(forbidden)
    }
    assert not bad, sorted(bad)


def test_one_module_reads_the_environment() -> None:
    readers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "os.environ" in path.read_text() or "getenv" in path.read_text()
    )
    assert readers == ["common/switches.py"], readers


def test_the_stock_peer_imports_common_only() -> None:
    """The bench's stock peer is built from stock parts and the package's common code, never a
    backend's kernels."""
    ours = {name for name in _imports(PACKAGE / "peer.py") if name.startswith("dsv41")}
    assert ours and all(name.startswith("dsv41.common") for name in ours), sorted(ours)
