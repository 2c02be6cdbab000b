#!/usr/bin/env python3
"""Checks the floor rule of ARCHITECTURE.md ("Folders and dependency direction") on every
#include "..." of the project's C++ files: a folder includes only itself and the folders below
it that the table lets it include. Prints one line per include that breaks the rule (file, line,
what it includes, what that folder may include) and exits 1 if there is any; 0 and a summary
otherwise.

It also checks each library's links against its includes: a `gradsync_cc_library` (any
CMakeLists.txt) links exactly the rooms of common/ that its files include, as their targets
`gradsync_common_<room>`, and never `gradsync_common` (every room at once, for tests and tools).
A library's files are its SRCS, the header of each, and the other headers in their folders.

  scripts/check_includes.py [ROOT]        (default: the repository holding this script)

The rooms are matched longest prefix first (allreduce/plan/ before allreduce/). `gradsync/` is
the generated configuration header (build/gradsync/config.h), open to every folder. Includes of
other projects (<...>, or a first path part that is not a project folder) are not checked.
"""
import pathlib
import re
import sys

# Folder (a prefix of the including file's path) -> the folders it may include, besides itself.
# Keep this table and ARCHITECTURE.md's in step.
RULES = {
    "allreduce/plan/": [],
    "common/base/": [],
    "common/optim/": ["common/base/"],
    "common/data/": ["common/base/"],
    "common/obs/": ["common/base/"],
    "common/config/": ["common/base/", "common/optim/"],
    "common/net/": ["common/base/"],
    "common/ps/": ["common/base/", "common/optim/", "common/config/", "common/net/", "common/table/"],
    "common/table/": ["common/base/", "common/optim/"],
    "models/": ["common/"],
    "compression/": ["common/"],
    "allreduce/": ["common/", "allreduce/plan/"],
    "server/": ["common/", "compression/"],
    "worker/": ["common/", "models/", "compression/", "allreduce/"],
    "experiments/process/": ["common/"],
    "experiments/spec/": ["common/", "experiments/process/"],
    "experiments/trace/": ["common/", "experiments/process/"],
    "experiments/launch/": ["common/", "experiments/process/", "experiments/spec/", "experiments/trace/"],
    "experiments/sim/": ["common/", "compression/", "allreduce/plan/", "experiments/spec/", "experiments/trace/"],
    "experiments/": ["common/", "compression/", "allreduce/plan/"],
    "python/": ["common/", "models/", "compression/", "allreduce/", "worker/"],
    "fuzz/": ["common/", "compression/", "server/", "experiments/"],
    "bench/": ["common/", "models/", "compression/", "allreduce/", "server/", "worker/", "experiments/"],
    "tests/": ["common/", "models/", "compression/", "allreduce/", "server/", "worker/", "experiments/", "python/"],
}
OPEN_TO_ALL = ["gradsync/"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SUFFIXES = (".h", ".cc", ".cu", ".cuh")


def room(path):
    for prefix in sorted(RULES, key=len, reverse=True):
        if path.startswith(prefix):
            return prefix
    return None


def allowed(src_room, target):
    if target.startswith(src_room) or any(target.startswith(p) for p in OPEN_TO_ALL):
        return True
    # A folder may include a room inside what it may include (allreduce/ covers allreduce/plan/),
    # but a room may not include its parent folder (allreduce/plan/ must not see allreduce/).
    return any(target.startswith(p) for p in RULES[src_room])


COMMON_ROOM = re.compile(r"^common/([a-z_]+)/")
LIBRARY = re.compile(r"gradsync_cc_library\s*\((.*?)\)", re.S)


def sources(root):
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix in SUFFIXES and path.is_file() and not rel.split("/")[0].startswith(("build", ".")):
            yield path, rel


def includes(path):
    for n, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
        m = INCLUDE.match(line)
        if m:
            yield n, m.group(1)


def libraries(root):
    """(name, CMakeLists.txt, files, linked targets) of every gradsync_cc_library."""
    for cmake in sorted(root.rglob("CMakeLists.txt")):
        rel_dir = cmake.parent.relative_to(root).as_posix()
        if rel_dir.split("/")[0].startswith(("build", ".")):
            continue
        text = re.sub(r"#[^\n]*", "", cmake.read_text())
        for m in LIBRARY.finditer(text):
            words = m.group(1).split()
            parts, key = {}, None
            for w in words:
                if w in ("NAME", "SRCS", "DEPS", "PRIVATE_DEPS"):
                    key = w
                    parts.setdefault(key, [])
                elif key:
                    parts[key].append(w)
            srcs = [cmake.parent / src for src in parts.get("SRCS", [])]
            files = set(srcs)
            for folder in {src.parent for src in srcs}:  # each folder listed once
                files.update(p for p in folder.iterdir() if p.suffix in (".h", ".cuh"))
            name = "gradsync_" + parts["NAME"][0]
            links = set(parts.get("DEPS", [])) | set(parts.get("PRIVATE_DEPS", []))
            yield name, cmake.relative_to(root).as_posix(), sorted(files), links


def check_links(root):
    """Prints each library whose common/ links differ from its includes; returns how many."""
    broken = 0
    for name, cmake, files, links in libraries(root):
        used = {}
        for path in files:
            if not path.is_file():
                continue
            for n, target in includes(path):
                m = COMMON_ROOM.match(target)
                if m:
                    used.setdefault(m.group(1), f"{path.relative_to(root).as_posix()}:{n}")
        if name.startswith("gradsync_common_"):
            used.pop(name[len("gradsync_common_"):], None)  # a room's own files
        linked = {t[len("gradsync_common_"):] for t in links if t.startswith("gradsync_common_")}
        if "gradsync_common" in links:
            print(f"{cmake}: {name} links gradsync_common (every room); link the rooms it uses: "
                  + ", ".join("gradsync_common_" + r for r in sorted(used)))
            broken += 1
            continue
        for r in sorted(set(used) - linked):
            print(f"{cmake}: {name} includes common/{r}/ ({used[r]}) but does not link gradsync_common_{r}")
            broken += 1
        for r in sorted(linked - set(used)):
            print(f"{cmake}: {name} links gradsync_common_{r} but includes nothing of common/{r}/")
            broken += 1
    return broken


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    folders = {p.split("/")[0] + "/" for p in RULES}
    broken = checked = 0
    for path, rel in sources(root):
        src_room = room(rel)
        if src_room is None:
            continue
        for n, target in includes(path):
            if target.split("/")[0] + "/" not in folders and not any(target.startswith(p) for p in OPEN_TO_ALL):
                continue  # another project's header, or one beside the file
            checked += 1
            if not allowed(src_room, target):
                broken += 1
                may = ", ".join(RULES[src_room]) or "nothing else"
                print(f"{rel}:{n}: includes {target}, but {src_room} may include only itself and {may}")
    bad_links = check_links(root)
    if broken or bad_links:
        print(f"check_includes: {broken} include(s) break the floor rule (ARCHITECTURE.md), "
              f"{bad_links} library link(s) differ from the includes", file=sys.stderr)
        return 1
    print(f"check_includes: {checked} includes of the project's folders follow the floor rule; "
          f"every library links the rooms of common/ it includes, and no other")
    return 0


if __name__ == "__main__":
    sys.exit(main())
