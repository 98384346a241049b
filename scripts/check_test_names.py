#!/usr/bin/env python3
"""Fails when a doctest test-case name would not run under ctest.

doctest_discover_tests registers each test case as one ctest test and runs it with --test-case=NAME. CMake
splits a name at ';' into several tests, each of which matches no test case and passes without running
anything. Usage: scripts/check_test_names.py [ROOT]
"""
import pathlib
import re
import sys

NAME = re.compile(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"', re.S)


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    bad = []
    for path in sorted((root / "tests").rglob("*")):
        if path.suffix not in {".cpp", ".cu", ".h"}:
            continue
        text = path.read_text(errors="replace")
        for m in NAME.finditer(text):
            if ";" in m.group(1):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path.relative_to(root)}:{line}: test case name has ';', which ctest splits "
                           f"into tests that run nothing: {m.group(1)!r}")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
