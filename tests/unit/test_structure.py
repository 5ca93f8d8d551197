"""The package's shape: no import cycle among rlhf_dyna's modules (imports inside functions count: a deferred import
that dodges a cycle is still one), the pure layers import no torch.distributed, and no module passes ~400 lines."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rlhf_dyna"
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (functions included), with the packages whose
`__init__` each import runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # importing a.b.c runs a/__init__ and a/b/__init__ first: those count, but not this module's own packages
            while target:
                if target != name and not name.startswith(target + "."):
                    out.add(target)
                target = target.rpartition(".")[0]
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    assert cycles(graph()) == []


def test_pure_layers_import_nothing_live():
    """vps/ imports nothing of the project but itself; the placement part of elastic/ only vps and the layout type."""
    g = graph()
    for name, deps in g.items():
        if name.startswith("rlhf_dyna.vps"):
            assert all(d.startswith("rlhf_dyna.vps") for d in deps), (name, deps)
    pure = ("placement", "policies", "validate", "rebalance", "simulate", "membership", "events", "membership_plan",
            "replicas")
    for name in pure:
        deps = g[f"rlhf_dyna.elastic.{name}"]
        assert all(d.startswith(("rlhf_dyna.vps", "rlhf_dyna.elastic", "rlhf_dyna.parallel_layout")) for d in deps), deps
    assert all(d.startswith("rlhf_dyna.vps") for d in g["rlhf_dyna.parallel_layout"])


def test_no_module_over_the_size_limit():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_package_is_in_the_wheel():
    """A built wheel carries the packages pyproject.toml lists: every folder of rlhf_dyna must be among them."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")
               if "conf" not in p.parent.relative_to(PACKAGE).parts}
    assert folders - listed == set()
