#!/usr/bin/env python3
"""Checks that every target's dependencies in Package.swift are exactly the modules its Swift files import.

A dependency no file imports is reported as unused; an imported module the target does not declare (one that builds
only because another dependency brings it along) as missing. Apple frameworks count as imports of their Linux
shims (`appleShims` in Package.swift); the toolchain's own modules (Foundation, Testing, Glibc, …) are ignored.

Usage: check.py [--package-dir DIR] [--dump FILE]   (FILE: `swift package dump-package` output; run it when absent)
Exit status 0 when every target agrees, 1 with one line per disagreement otherwise.
"""
import argparse
import json
import os
import re
import subprocess
import sys

# Modules of the toolchain and the platforms, never declared as package dependencies.
SYSTEM_MODULES = {
    "Foundation", "FoundationEssentials", "FoundationNetworking", "FoundationXML", "Glibc", "Musl", "Darwin", "WinSDK",
    "Dispatch", "Synchronization", "Testing", "XCTest", "_Concurrency", "_StringProcessing", "RegexBuilder",
    "Observation", "Swift", "CoreFoundation", "Combine",
}

IMPORT = re.compile(
    r"^\s*(?:@[A-Za-z_]+(?:\([^)]*\))?\s+)*(?:(?:public|package|internal|private|fileprivate)\s+)?import\s+"
    r"(?:(?:struct|class|enum|protocol|func|var|let|typealias|actor)\s+)?([A-Za-z_][A-Za-z0-9_]*)",
    re.MULTILINE,
)
SHIM = re.compile(r'"([A-Za-z]+)":\s*"([A-Za-z]+Shim)"')
BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
# Multi-line string literals (a Python script a test runs holds `import json` lines of its own).
MULTILINE_STRING = re.compile(r'(#*)"""\n.*?\n\s*"""\1', re.DOTALL)
LINE_COMMENT = re.compile(r"//[^\n]*")


def imports_in(directory):
    """The modules the Swift files under `directory` import (an import is a line of its own outside comments and
    multi-line string literals)."""
    found = set()
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if not name.endswith(".swift"):
                continue
            with open(os.path.join(root, name), encoding="utf-8") as handle:
                text = handle.read()
            text = LINE_COMMENT.sub("", BLOCK_COMMENT.sub("", MULTILINE_STRING.sub("", text)))
            found.update(IMPORT.findall(text))
    return found


def declared(target):
    """The module names a target depends on (a product's module is named as the product)."""
    names = set()
    for dependency in target.get("dependencies", []):
        kind, value = next(iter(dependency.items()))
        names.add(value[0])
    return names


def target_directory(package_dir, target):
    if target.get("path"):
        return os.path.join(package_dir, target["path"])
    base = "Tests" if target["type"] == "test" else "Sources"
    return os.path.join(package_dir, base, target["name"])


def check(package, package_dir, shims):
    """One line per disagreement, sorted."""
    problems = []
    local = {t["name"] for t in package["targets"]}
    for target in package["targets"]:
        if target["type"] not in ("regular", "executable", "test"):
            continue
        directory = target_directory(package_dir, target)
        if not os.path.isdir(directory):
            problems.append(f"{target['name']}: no directory {os.path.relpath(directory, package_dir)}")
            continue
        if not any(name.endswith(".swift") for _r, _d, files in os.walk(directory) for name in files):
            continue  # a C target: its headers are its imports' business
        imported = set()
        for module in imports_in(directory) - SYSTEM_MODULES - {target["name"]}:
            imported.add(shims.get(module, module))
        wanted = declared(target)
        for module in sorted(imported - wanted):
            kind = "target" if module in local else "product"
            problems.append(f"{target['name']}: imports {module} but does not declare it (add the {kind} to its dependencies)")
        for module in sorted(wanted - imported):
            problems.append(f"{target['name']}: declares {module} but no file imports it (remove it from its dependencies)")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--package-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    parser.add_argument("--dump", help="`swift package dump-package` output (run when absent)")
    arguments = parser.parse_args(argv)
    package_dir = os.path.abspath(arguments.package_dir)
    if arguments.dump:
        with open(arguments.dump, encoding="utf-8") as handle:
            package = json.load(handle)
    else:
        output = subprocess.run(["swift", "package", "dump-package"], cwd=package_dir, check=True, capture_output=True, text=True).stdout
        package = json.loads(output)
    with open(os.path.join(package_dir, "Package.swift"), encoding="utf-8") as handle:
        shims = dict(SHIM.findall(handle.read()))
    problems = check(package, package_dir, shims)
    for line in problems:
        print(line)
    if problems:
        print(f"package-deps: {len(problems)} disagreement(s) between Package.swift and the imports", file=sys.stderr)
        return 1
    print(f"package-deps: {sum(1 for t in package['targets'] if t['type'] in ('regular', 'executable', 'test'))} targets, dependencies equal imports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
