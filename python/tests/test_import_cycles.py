"""No module of python/gradsync imports one that imports it back, directly or through others, at
module level or inside a function (scripts/import_cycles.py); and the check does see a cycle."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "import_cycles.py")


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=60)
    return p.returncode, p.stdout


def test_gradsync_has_no_import_cycle():
    rc, out = run()
    assert rc == 0, out
    assert out.startswith("no import cycles among "), out


def test_a_cycle_through_a_relative_and_a_function_level_import_is_reported(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import f\n")
    (pkg / "a.py").write_text("from .sub import b\n\n\ndef f():\n    return b.g()\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def g():\n    from ..a import f\n    return f\n")
    (pkg / "c.py").write_text("import pkg.a\n")  # imports into the cycle, is not on it
    rc, out = run(str(pkg))
    assert rc == 1, out
    assert "import cycle: pkg.a -> pkg.sub.b -> pkg.a" in out, out
    assert "sub/b.py:2 (in g) imports pkg.a" in out, out
    assert "pkg.c" not in out, out


def test_without_the_function_level_import_there_is_no_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a, b\n")  # a package's __init__ importing its modules
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("import os\n")
    rc, out = run(str(pkg))
    assert rc == 0, out
    assert out.strip() == "no import cycles among 3 modules", out
