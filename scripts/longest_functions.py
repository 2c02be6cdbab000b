#!/usr/bin/env python3
"""Lists the longest function definitions in C++ files, for keeping functions small.

  scripts/longest_functions.py [--top N] [--rev REV] DIR...

A definition starts at a line that begins at column 0 with a name and ends with '{' (or whose
signature continues onto following lines up to the '{'), and ends at the next line that is a
lone '}' at column 0, as the project's clang-format style writes them. Lambdas count as part of
the function that holds them. With --rev the files are read from that commit (git show).
"""
import argparse
import re
import subprocess
import sys

START = re.compile(r"^(?!namespace\b|class\b|struct\b|enum\b|union\b|extern\b|template\b|#|//|\s)[^;]*\(")


def files_at(rev, dirs):
    if rev:
        out = subprocess.check_output(["git", "ls-tree", "-r", "--name-only", rev, "--", *dirs], text=True)
    else:
        out = subprocess.check_output(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *dirs],
                                      text=True)
    return [f for f in out.split() if f.endswith((".cc", ".h", ".cu", ".cuh"))]


def read(rev, path):
    if rev:
        return subprocess.check_output(["git", "show", f"{rev}:{path}"], text=True)
    with open(path) as f:
        return f.read()


def functions(path, text):
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if START.match(line):
            # The signature may run over several lines; the body opens on the line ending in '{'.
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith(("{", ";", "}")):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("}"):  # a one-line body: not a long function
                i = j + 1
                continue
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                k = j + 1
                while k < len(lines) and lines[k] != "}":
                    k += 1
                name = re.sub(r"\s+", " ", line.split("(")[0]).split(" ")[-1]
                yield (k - i + 1, f"{path}:{i + 1}", name)
                i = k + 1
                continue
        i += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--rev")
    p.add_argument("dirs", nargs="+")
    a = p.parse_args()
    for d in a.dirs:
        found = []
        for f in files_at(a.rev, [d]):
            found.extend(functions(f, read(a.rev, f)))
        found.sort(reverse=True)
        print(f"{d}: the {a.top} longest functions{' at ' + a.rev if a.rev else ''}")
        for n, where, name in found[: a.top]:
            print(f"  {n:5d} lines  {name:<36} {where}")


if __name__ == "__main__":
    sys.exit(main())
