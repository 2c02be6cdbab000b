#!/usr/bin/env python3
"""Import cycles among the modules of a Python package (default: python/gradsync).

Every module of the package is parsed with `ast` (nothing is imported); every `import` and
`from ... import` counts, at module level and inside functions, classes, `if` and `try` alike (a
lazy import is still an import), relative ones resolved against the module's package. An edge goes
from a module to each module of the package it names: `import a.b.c` names a.b.c (or the longest
prefix of it that is a module of the package); `from P import x` names P.x when that is a module
of the package, P when P is a plain module or a package whose __init__ binds x (or x is *), and
nothing otherwise (x is then a compiled module, such as gradsync._native, outside the sources). The
packages Python initialises on the way (P's __init__ for `from P.m import x`) are not edges: a
package's __init__ that imports its own modules is no cycle.

Prints each elementary cycle (a -> b -> ... -> a, with the file and line of every import on
it) and exits 1, or prints "no import cycles among N modules" and exits 0.

Usage: scripts/import_cycles.py [ROOT]   (ROOT: the package's directory)
"""

import ast
import os
import sys

MAX_CYCLES = 100  # printed per strongly connected set of modules


def find_modules(root):
    """{module name: file path} for every .py file under root; root's own name is the package's."""
    root = os.path.abspath(root)
    base = os.path.basename(root.rstrip(os.sep))
    modules = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(folder, root)
        parts = [base] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            name = ".".join(parts) if f == "__init__.py" else ".".join(parts + [f[:-3]])
            modules[name] = os.path.join(folder, f)
    return modules


def _package_of(module, path):
    """The package a relative import in `module` is relative to."""
    if os.path.basename(path) == "__init__.py":
        return module
    return module.rpartition(".")[0]


def _known_prefix(name, modules):
    """The longest prefix of the dotted `name` that is one of `modules` (None if none is)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _parse(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def bound_names(tree):
    """The names a module binds at its top level (assignments, def, class, imports)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def imports_of(module, path, modules, packages):
    """[(imported module, line, enclosing function or None)] for the package's modules that
    `module` imports, anywhere in its file. packages: {package: the names its __init__ binds}."""
    tree = _parse(path)
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            targets = []
            if isinstance(child, ast.Import):
                targets = [_known_prefix(alias.name, modules) for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = _package_of(module, path).split(".")
                    up = child.level - 1
                    if up >= len(base):
                        base = []  # above the package: nothing of it
                    else:
                        base = base[:len(base) - up]
                    if not base:
                        visit(child, inner)
                        continue
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module
                for alias in child.names:
                    full = source + "." + alias.name
                    if full in modules:
                        targets.append(full)
                    elif source in packages and alias.name != "*" and alias.name not in packages[source]:
                        continue  # neither a module here nor a name the package binds: a compiled module
                    else:
                        targets.append(_known_prefix(source, modules))
            for t in sorted(set(t for t in targets if t is not None and t != module)):
                found.append((t, child.lineno, function))  # (a module's names from itself: no cycle)
            visit(child, inner)

    visit(tree, None)
    return found


def build_graph(root):
    modules = find_modules(root)
    packages = {m: bound_names(_parse(path)) for m, path in modules.items()
                if os.path.basename(path) == "__init__.py"}
    graph = {m: {} for m in modules}  # module -> {imported module: [(path, line, function)]}
    for m, path in modules.items():
        for target, line, function in imports_of(m, path, modules, packages):
            graph[m].setdefault(target, []).append((path, line, function))
    return modules, graph


def strongly_connected(graph):
    """Tarjan's strongly connected components, each a sorted list."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            out.append(sorted(component))

    sys.setrecursionlimit(max(1000, 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def cycles_in(component, graph):
    """The elementary cycles within one strongly connected component, each starting at its
    smallest module (at most MAX_CYCLES)."""
    members = set(component)
    cycles = []
    for start in component:
        # Cycles whose smallest module is `start`: paths through larger members back to it.
        path = [start]

        def extend(v):
            for w in sorted(graph[v]):
                if len(cycles) >= MAX_CYCLES:
                    return
                if w == start:
                    cycles.append(path + [start])
                elif w in members and w > start and w not in path:
                    path.append(w)
                    extend(w)
                    path.pop()

        extend(start)
    return cycles


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = argv[1] if len(argv) > 1 else os.path.join(here, "..", "python", "gradsync")
    if len(argv) > 2 or not os.path.isdir(root):
        print("usage: import_cycles.py [ROOT] (ROOT: a package's directory; default python/gradsync)",
              file=sys.stderr)
        return 2
    modules, graph = build_graph(root)
    shown_root = os.path.dirname(os.path.abspath(root))
    found = 0
    for component in strongly_connected(graph):
        if len(component) == 1:
            continue
        for cycle in cycles_in(component, graph):
            found += 1
            print("import cycle: " + " -> ".join(cycle))
            for a, b in zip(cycle, cycle[1:]):
                for path, line, function in graph[a][b]:
                    where = " (in %s)" % function if function else ""
                    print("  %s:%d%s imports %s" % (os.path.relpath(path, shown_root), line, where, b))
    if found:
        print("%d import cycle%s among %d modules" % (found, "" if found == 1 else "s", len(modules)))
        return 1
    print("no import cycles among %d modules" % len(modules))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
