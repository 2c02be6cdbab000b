#!/usr/bin/env python3
"""Lists the largest C++ classes by what they define, for dividing classes by responsibility.

  scripts/class_sizes.py [--top N] [--rev REV] [--check] DIR...

How it counts, per class (a class split over files counts whole):
- methods: the member functions the class defines: each inline body in its class body (braces
  inside parentheses, a default argument's `= {}`, open none), and each
  out-of-line definition `Class::Name(...) {` at column 0 in any .cc/.cu file of DIR (a nested
  class's are its own; constructors and destructors count, declarations without a body do not);
- members: the data members declared in its class body at its own brace depth (statements that
  end with ';' and declare no function: no '(' before a '=' or '{' initializer; static
  constexpr constants, using and friend declarations excluded);
- lines: the lines of its class body in the header plus the lines of every out-of-line
  definition (from the signature to its closing '}' at column 0).
Structs with no member functions other than inline accessors count too: a settings struct with
many fields shows as many members.

With --check, exits 1 when a class has more than 25 methods or 15 members or 600 lines (the
limits of a class divided by responsibility), naming each. With --rev the files are read from
that commit.
"""
import argparse
import re
import sys
from collections import defaultdict

from longest_functions import files_at, read  # the same files, read the same way

CLASS = re.compile(r"^(\s*)(?:class|struct)\s+(?:\[\[[^\]]*\]\]\s*)?(?:[A-Z]\w*::)*([A-Z]\w*)(?:\s+final)?(?:\s*:(?!:)[^{;]*)?\s*\{\s*$")
OUT_OF_LINE = re.compile(r"^(?!\s|//|#)(?:[\w:<>,\s*&]*?\s)?(?:[\w:]*::)?([A-Z]\w*)::(~?\w+|operator\S+)\s*\(")


def strip_comments(line):
    i = line.find("//")
    return line if i < 0 else line[:i]


class Stats:
    def __init__(self):
        self.methods = 0
        self.members = 0
        self.lines = 0
        self.files = set()


def scan_header(path, text, stats):
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = CLASS.match(lines[i])
        if not m:
            i += 1
            continue
        name = m.group(2)
        depth = 1
        start = i
        stmt = ""
        parens = 0
        j = i + 1
        s = stats[name]
        s.files.add(path)
        while j < len(lines) and depth > 0:
            raw = strip_comments(lines[j])
            if depth == 1 and CLASS.match(lines[j]):
                # a nested class: skip its body (it is counted on its own below)
                nd = 1
                j += 1
                while j < len(lines) and nd > 0:
                    nd += strip_comments(lines[j]).count("{") - strip_comments(lines[j]).count("}")
                    j += 1
                continue
            for ch in raw:
                if depth == 1:
                    stmt += ch
                    # Braces inside parentheses (a default argument `= {}`) open no body.
                    if ch == "(":
                        parens += 1
                    elif ch == ")":
                        parens = max(0, parens - 1)
                    elif ch in "{}" and parens > 0:
                        continue
                if ch == "{":
                    depth += 1
                    if depth == 2:
                        head = stmt[:-1]
                        if "(" in head.split("=")[0] and not re.search(r"\b(enum|struct|class|union)\b", head):
                            s.methods += 1  # an inline body
                            stmt = ""
                        elif re.search(r"\b(enum|struct|class|union)\b", head):
                            stmt = ""
                elif ch == "}":
                    depth -= 1
                    if depth == 1:
                        stmt += "}" if not stmt.endswith("}") else ""
                elif ch == ";" and depth == 1:
                    st = " ".join(stmt.split())
                    stmt = ""
                    if not st or st.startswith(("using ", "friend ", "static constexpr", "typedef ", "}")):
                        continue
                    st = re.sub(r"^(public|private|protected):\s*", "", st)
                    head = re.split(r"=|\{", st, maxsplit=1)[0]
                    if "(" in head or st.startswith(("enum", "static_assert", "template")):
                        continue  # a declaration (or a defaulted/deleted function)
                    if re.match(r"^\}?\s*;?$", st):
                        continue
                    s.members += 1
            stmt += " "
            j += 1
        s.lines += j - start
        i = start + 1  # nested classes are found on their own line


def scan_source(path, text, stats):
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = OUT_OF_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        # The signature may span lines up to its '{' (a declaration ends at ';').
        j = i
        sig = ""
        while j < len(lines):
            sig += strip_comments(lines[j])
            if "{" in strip_comments(lines[j]) or strip_comments(lines[j]).rstrip().endswith(";"):
                break
            j += 1
        if "{" not in sig or sig.split("{")[0].rstrip().endswith(";"):
            i = j + 1
            continue
        end = j
        if not lines[j].rstrip().endswith("}") or lines[j].lstrip().startswith("{"):
            end = j + 1
            while end < len(lines) and lines[end] != "}":
                end += 1
        s = stats[m.group(1)]
        s.methods += 1
        s.lines += end - i + 1
        s.files.add(path)
        i = end + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--rev")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    stats = defaultdict(Stats)
    for f in files_at(a.rev, a.dirs):
        text = read(a.rev, f)
        if f.endswith((".h", ".cuh")):
            scan_header(f, text, stats)
        else:
            scan_source(f, text, stats)
            scan_header(f, text, stats)  # classes local to a source file
    rows = sorted(((s.methods, s.members, s.lines, name, s) for name, s in stats.items() if s.methods or s.members),
                  key=lambda r: (-r[0], -r[1], -r[2]))
    print(f"{'class':<32} {'methods':>7} {'members':>7} {'lines':>6}  files")
    for methods, members, lines, name, s in rows[: a.top]:
        print(f"{name:<32} {methods:>7} {members:>7} {lines:>6}  {len(s.files)}")
    over = [(name, m, d, l) for m, d, l, name, _ in rows if m > 25 or d > 15 or l > 600]
    if a.check and over:
        for name, m, d, l in over:
            print(f"class_sizes: {name}: {m} methods, {d} members, {l} lines (limits 25, 15, 600)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
