#!/usr/bin/env python3
"""Checks the floor rule of ARCHITECTURE.md ("Folders and dependency direction") on every
#include "..." of the project's C++ files: a folder includes only itself and the folders below
it that the table lets it include. Prints one line per include that breaks the rule (file, line,
what it includes, what that folder may include) and exits 1 if there is any; 0 and a summary
otherwise.

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
    "common/": [],
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


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    folders = {p.split("/")[0] + "/" for p in RULES}
    broken = checked = 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix not in SUFFIXES or not path.is_file() or rel.split("/")[0].startswith(("build", ".")):
            continue
        src_room = room(rel)
        if src_room is None:
            continue
        for n, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if target.split("/")[0] + "/" not in folders and not any(target.startswith(p) for p in OPEN_TO_ALL):
                continue  # another project's header, or one beside the file
            checked += 1
            if not allowed(src_room, target):
                broken += 1
                may = ", ".join(RULES[src_room]) or "nothing else"
                print(f"{rel}:{n}: includes {target}, but {src_room} may include only itself and {may}")
    if broken:
        print(f"check_includes: {broken} include(s) break the floor rule (ARCHITECTURE.md)", file=sys.stderr)
        return 1
    print(f"check_includes: {checked} includes of the project's folders follow the floor rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
