"""No import circle anywhere in the package, imports inside function bodies included.

import-linter's ``layers`` contract (pyproject.toml) orders the top-level packages; this test
looks at every module, so a circle inside one package (``ledger.sql`` importing the dialect
classes that subclass it, say) fails too. The one edge left out is written down: the
runtime's deprecated forwarders ``runtime.attach``/``instrument``/``tools_schema`` (0.2.0,
removed in 0.3.0) import the adapters when called, by the compatibility rule.
"""

from __future__ import annotations

import grimp

_DEPRECATED_FORWARDERS = {("pipecat_actions.runtime.core", "pipecat_actions.adapters")}


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _package_edges() -> dict[str, set[str]]:
    graph = grimp.build_graph("pipecat_actions", include_external_packages=False)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    for importer, imported in _DEPRECATED_FORWARDERS:
        edges[importer].discard(imported)
    return edges


def test_no_module_of_the_package_reaches_itself_through_its_imports() -> None:
    assert _circles(_package_edges()) == []


def test_the_circle_finder_finds_a_circle_inside_one_package() -> None:
    edges = _package_edges()
    edges["pipecat_actions.ledger.sql"].add("pipecat_actions.ledger.sqlite")
    assert any(
        {"pipecat_actions.ledger.sql", "pipecat_actions.ledger.sqlite"} <= set(circle)
        for circle in _circles(edges)
    )


def test_the_deprecated_forwarders_are_the_only_edge_left_out() -> None:
    graph = grimp.build_graph("pipecat_actions", include_external_packages=False)
    runtime_up = {
        (importer, imported)
        for importer in graph.modules
        if importer.startswith("pipecat_actions.runtime")
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported.startswith("pipecat_actions.adapters")
    }
    assert runtime_up == _DEPRECATED_FORWARDERS
