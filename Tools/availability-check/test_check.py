#!/usr/bin/env python3
"""Self-test of check.py: `python3 Tools/availability-check/test_check.py` (or `python3 -m unittest` in this folder).

Most tests use the small synthetic toolchain under fixtures/toolchain; TestRealToolchain reads the installed
toolchain's interfaces and is skipped when none is found. Expected findings in the fixture sources are written next to
the code as `// expect: <name> <platforms>` comments (comments are stripped before the check, so they do not count as
uses), and the tests compare the checker's JSON with them in both directions.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures")
TOOLCHAIN = os.path.join(FIXTURES, "toolchain")
PKG17 = os.path.join(FIXTURES, "pkg17")
PKG18 = os.path.join(FIXTURES, "pkg18")
EXPECT = re.compile(r"expect: (\w+) ([a-z,]+)")


def run_json(*argv: str) -> tuple[int, dict]:
    out = io.StringIO()
    code = check.run([*argv, "--json"], out=out)
    return code, json.loads(out.getvalue())


def run_text(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = check.run(list(argv), out=out)
    return code, out.getvalue()


def found(report: dict) -> set:
    """{(file name, line, api name, 'ios,macos')} from a JSON report."""
    return {(os.path.basename(f["path"]), f["line"], f["name"],
             ",".join(sorted(p.lower() for p in f["unguarded_platforms"])))
            for f in report["findings"]}


def expected(package: str) -> set:
    out = set()
    for dirpath, _, files in os.walk(os.path.join(package, "Sources")):
        for name in files:
            if not name.endswith(".swift"):
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    for api, platforms in EXPECT.findall(line):
                        out.add((name, line_no, api, ",".join(sorted(platforms.split(",")))))
    return out


def line_of(package: str, file: str, needle: str) -> int:
    with open(os.path.join(package, "Sources", "Demo", file), encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if needle in line:
                return i
    raise AssertionError(f"{needle!r} not in {file}")


class TestStripping(unittest.TestCase):
    def test_comments_and_strings_become_spaces_with_lines_kept(self):
        src = ('let a = 1 // Mutex\n/* x /* Mutex */ still comment\n Mutex */ let b = "Mutex"\n'
               'let c = """\n  Mutex \\(d) "q"\n  """\nlet e = #"Mutex"\\(x)"#; let f = Mutex(1)\n')
        out = check.strip_comments_and_strings(src)
        self.assertEqual(len(out), len(src))
        self.assertEqual(out.count("\n"), src.count("\n"))
        self.assertEqual(out.count("Mutex"), 1)  # only the real use on the last line
        self.assertIn("let f = Mutex(1)", out.splitlines()[6])
        self.assertRegex(out.splitlines()[4], r"^\s+d\)\s+$")  # the interpolation is code, the rest is not
        self.assertNotIn("x", out.splitlines()[6].split("let f")[0].replace("let e", ""))  # raw: \( is text

    def test_interpolation_inside_string_is_code(self):
        out = check.strip_comments_and_strings('let s = "a \\(Mutex(1)) b \\("nested \\(Atomic)") c"\n')
        self.assertIn("Mutex(1)", out)
        self.assertIn("Atomic", out)
        self.assertNotIn("nested", out)


class TestConditions(unittest.TestCase):
    def test_platform_conditions(self):
        ev = check.eval_condition
        self.assertIs(ev("os(Linux)", "ios"), False)
        self.assertIs(ev("!canImport(Darwin)", "macos"), False)
        self.assertIs(ev("os(macOS)", "macos"), True)
        self.assertIs(ev("os(macOS)", "ios"), False)
        self.assertIs(ev("os(Linux) || os(Android)", "ios"), False)
        self.assertIs(ev("canImport(UIKit) && !os(tvOS) && !os(watchOS)", "ios"), True)
        self.assertIsNone(ev("canImport(SomeShim)", "ios"))
        self.assertIsNone(ev("DEBUG", "macos"))
        self.assertIsNone(ev("!canImport(SomeShim)", "ios"))


class TestSyntheticTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.interfaces = check.find_interfaces(TOOLCHAIN)
        cls.table, cls.indexed = check.build_table(cls.interfaces)

    def req(self, name):
        e = self.table[name]
        return check.vstr(e.req["ios"]), check.vstr(e.req["macos"])

    def test_reads_only_public_interfaces(self):
        files = sorted(os.path.basename(p) for _, p in self.interfaces)
        self.assertEqual(files, ["x86_64-unknown-linux-gnu.swiftinterface"] * 3)
        self.assertNotIn("privateInterfaceOnly", self.table)

    def test_types_members_and_inherited_availability(self):
        self.assertEqual(self.req("Mutex"), ("18.0", "15.0"))
        self.assertEqual(self.table["Mutex"].modules, ["Synchronization"])
        self.assertEqual(self.req("withLock"), ("18.0", "15.0"))  # from the extension's @available
        self.assertEqual(self.req("relaxed"), ("18.0", "15.0"))
        self.assertEqual(self.req("enqueueNew"), ("18.0", "15.0"))  # protocol requirement, no `public`
        for case in ("precise", "approximate", "rough"):
            self.assertEqual(self.req(case), ("18.0", "15.0"))
        self.assertEqual(self.req("Atomic"), ("18.0", "15.0"))  # @_originallyDefinedIn changes nothing
        self.assertEqual(self.req("InlineArray"), ("26.0", "26.0"))

    def test_platform_specific_availability(self):
        ios, macos = self.table["Backtrace"].req["ios"], self.table["Backtrace"].req["macos"]
        self.assertEqual(ios, ())  # `@available(macOS 26.0, *)`: no iOS requirement
        self.assertEqual(macos, (26,))

    def test_back_deployed_overloaded_and_unavailable(self):
        self.assertEqual(self.req("withBackDeployedThing"), ("13.0", "10.15"))
        self.assertEqual(self.table["load"].req, {"ios": (), "macos": ()})  # also on UnsafeRawPointer
        self.assertEqual(self.req("laterThing"), ("18.0", "15.0"))  # the unavailable overload does not count

    def test_ignored_declarations(self):
        for name in ("_underscoredThing", "internalThing", "spiOnlyHelper", "internalHelper", "unsafeLock",
                     "brace", "handle", "_storage"):
            self.assertNotIn(name, self.table, name)

    def test_nested_type_is_member_only(self):
        e = self.table["ValidationError"]
        self.assertFalse(e.top_level)
        self.assertEqual(e.parents, {"UTF8"})
        self.assertTrue(self.table["Mutex"].top_level)


class TestPackageSwift(unittest.TestCase):
    def test_forms(self):
        self.assertEqual(check.read_platforms(os.path.join(PKG17, "Package.swift")), {"macos": "14", "ios": "17"})
        self.assertEqual(check.read_platforms(os.path.join(PKG18, "Package.swift")), {"ios": "18.0", "macos": "15"})
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "Package.swift")
            with open(path, "w") as f:
                f.write('let p = Package(name: "x", platforms: [.macOS(.v10_15), .iOS("16.4")])\n')
            self.assertEqual(check.read_platforms(path), {"macos": "10.15", "ios": "16.4"})


class TestFixturePackage17(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.code, cls.report = run_json("--package", PKG17, "--toolchain", TOOLCHAIN)
        cls.found = found(cls.report)

    def flagged(self, file, needle, name="Mutex"):
        line = line_of(PKG17, file, needle)
        return {p for (f, ln, n, p) in self.found if f == file and ln == line and n == name}

    def test_exit_code_and_targets(self):
        self.assertEqual(self.code, 1)
        self.assertFalse(self.report["ok"])
        self.assertEqual(self.report["deployment_targets"], {"iOS": "17", "macOS": "14"})
        self.assertEqual(self.report["files_checked"], 3)

    def test_findings_match_the_expect_comments(self):
        exp = expected(PKG17)
        self.assertGreaterEqual(len(exp), 15)
        self.assertEqual(self.found - exp, set(), "unexpected findings")
        self.assertEqual(exp - self.found, set(), "missed findings")

    def test_unguarded_use_is_flagged(self):
        self.assertEqual(self.flagged("Cases.swift", "let unguarded = Mutex"), {"ios,macos"})

    def test_available_attribute_guards(self):
        self.assertEqual(self.flagged("Cases.swift", "let lock = Mutex"), set())
        self.assertEqual(self.flagged("Cases.swift", "let work = { Mutex(1) }"), set())
        self.assertEqual(self.flagged("Cases.swift", ") -> Mutex<Int> {"), set())
        self.assertEqual(self.flagged("Cases.swift", "func longForm()"), set())

    def test_if_and_guard_available(self):
        self.assertEqual(self.flagged("Cases.swift", "let inside = Mutex(2)"), set())
        self.assertEqual(self.flagged("Cases.swift", "let fallback = Mutex(3)"), {"ios,macos"})
        self.assertEqual(self.flagged("Cases.swift", "let afterGuard = Mutex(6)"), set())
        self.assertEqual(self.flagged("Cases.swift", "let inElse = Mutex(5)"), {"ios,macos"})
        self.assertEqual(self.flagged("Cases.swift", "let old = Mutex(20)"), {"ios,macos"})  # if #unavailable
        self.assertEqual(self.flagged("Cases.swift", "let new = Mutex(21)"), set())  # … else { }
        self.assertEqual(self.flagged("Cases.swift", "let newer = Mutex(22)"), set())  # guard #unavailable … else

    def test_macos_only_guard_still_flags_ios(self):
        self.assertEqual(self.flagged("Cases.swift", "let m = Mutex(7)"), {"ios"})
        self.assertEqual(self.flagged("Cases.swift", "let m = Mutex(8)"), {"ios"})

    def test_comments_and_strings_are_not_uses(self):
        for needle in ("Mutex(11)", "Mutex(12)", "Mutex(13)", 'Mutex("14")', "Mutex(15)"):
            self.assertEqual(self.flagged("Cases.swift", needle), set(), needle)
        self.assertEqual(self.flagged("Cases.swift", "Mutex(16)"), {"ios,macos"})  # inside \( ) is code

    def test_linux_only_code_is_skipped(self):
        self.assertEqual(self.flagged("Platforms.swift", "let linuxOnly"), set())
        self.assertEqual(self.flagged("Platforms.swift", "let noDarwin"), set())
        self.assertEqual(self.flagged("Platforms.swift", "let glibc"), set())
        self.assertEqual(self.flagged("Platforms.swift", "let appleSide"), {"ios,macos"})
        self.assertEqual(self.flagged("Platforms.swift", "let macSide"), {"macos"})

    def test_project_names_and_missing_imports(self):
        self.assertFalse([f for f in self.found if f[0] == "NoImport.swift"])
        self.assertEqual(self.flagged("Cases.swift", 'throw ValidationError("x")', "ValidationError"), set())

    def test_message_format(self):
        code, text = run_text("--package", PKG17, "--toolchain", TOOLCHAIN)
        self.assertEqual(code, 1)
        line = line_of(PKG17, "Cases.swift", "let unguarded = Mutex")
        self.assertIn(f"Cases.swift:{line}:17: error: 'Mutex' (Synchronization) needs iOS 18.0 / macOS 15.0; "
                      "Package.swift declares iOS 17 / macOS 14 — guard it with @available/#available or raise the "
                      "platforms\n", text)
        self.assertRegex(text.splitlines()[-1], r"^availability-check: 21 unguarded use\(s\) of 8 API name\(s\)")


def unguarded_copy(tmp: str, also_if_available: bool = False) -> str:
    """A copy of the iOS 17 fixture in `tmp` with `Guarded`'s @available removed (and its `if #available`, if asked)."""
    pkg = os.path.join(tmp, "pkg")
    shutil.copytree(PKG17, pkg)
    path = os.path.join(pkg, "Sources", "Demo", "Cases.swift")
    with open(path, encoding="utf-8") as f:
        src = f.read()
    src = src.replace("@available(iOS 18, macOS 15, *)\n@MainActor\nfinal class Guarded", "@MainActor\nfinal class Guarded", 1)
    if also_if_available:
        src = src.replace("if #available(iOS 18.0, macOS 15.0, *) {", "if Bool.random() {", 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(src)
    return pkg


class TestGuardsAreWhatSuppress(unittest.TestCase):
    """Removing a guard from the fixture must produce a finding (the test would catch a checker that flags nothing)."""

    def test_removing_guards_adds_findings(self):
        with tempfile.TemporaryDirectory() as tmp:
            pkg = unguarded_copy(tmp, also_if_available=True)
            _, report = run_json("--package", pkg, "--toolchain", TOOLCHAIN)
            new = found(report) - expected(pkg)
            self.assertEqual({(ln, n) for (_, ln, n, _) in new},
                             {(line_of(pkg, "Cases.swift", "let lock = Mutex"), "Mutex"),
                              (line_of(pkg, "Cases.swift", "let work = { Mutex(1) }"), "Mutex"),
                              (line_of(pkg, "Cases.swift", "return lock.withLock"), "withLock"),
                              (line_of(pkg, "Cases.swift", "let inside = Mutex(2)"), "Mutex")})

    def test_names_declared_only_for_linux_do_not_hide_uses(self):
        # A Linux-only stand-in that declares `withLock` is not compiled for Apple platforms: Mutex's withLock is still
        # a use there. The same declaration outside `#if os(Linux)` is the project's own name and hides the use.
        def withlock_findings(shim: str) -> set:
            with tempfile.TemporaryDirectory() as tmp:
                pkg = unguarded_copy(tmp)
                with open(os.path.join(pkg, "Sources", "Demo", "Shim.swift"), "w", encoding="utf-8") as f:
                    f.write(shim)
                _, report = run_json("--package", pkg, "--toolchain", TOOLCHAIN)
                return {n for (_, _, n, _) in found(report) if n == "withLock"}

        box = "final class Box {\n    func withLock() {}\n}\n"
        self.assertEqual(withlock_findings("#if os(Linux)\n" + box + "#endif\n"), {"withLock"})
        self.assertEqual(withlock_findings(box), set())


class TestFixturePackage18(unittest.TestCase):
    def test_mutex_passes_but_a_later_api_is_flagged(self):
        code, report = run_json("--package", PKG18, "--toolchain", TOOLCHAIN)
        self.assertEqual(code, 1)
        self.assertEqual(report["deployment_targets"], {"iOS": "18.0", "macOS": "15"})
        self.assertEqual(found(report), expected(PKG18))
        self.assertEqual({f["name"] for f in report["findings"]}, {"InlineArray"})
        self.assertEqual(report["findings"][0]["needs"], {"iOS": "26.0", "macOS": "26.0"})

    def test_flags_override_package_swift(self):
        code, text = run_text("--package", PKG18, "--toolchain", TOOLCHAIN, "--ios", "26", "--macos", "26")
        self.assertEqual(code, 0)
        self.assertRegex(text, r"^availability-check: OK — 1 files checked, (\d+ use\(s\), all guarded,|no uses) "
                               r"of the \d+ API names newer than iOS 26 / macOS 26")
        code, _ = run_text("--package", PKG17, "--toolchain", TOOLCHAIN, "--ios", "18", "--macos", "15")
        self.assertEqual(code, 1)  # InlineArray, ValidationError, Backtrace... are still newer than 18 / 15

    def test_command_line(self):
        proc = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), "--package", PKG18, "--toolchain",
                               TOOLCHAIN, "--json"], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        report = json.loads(proc.stdout)
        for key in ("ok", "deployment_targets", "files_checked", "uses_checked", "api_names_in_table",
                    "api_names_indexed", "findings", "elapsed_seconds"):
            self.assertIn(key, report)
        for key in ("path", "line", "column", "name", "modules", "needs", "unguarded_platforms", "message"):
            self.assertIn(key, report["findings"][0])


def real_toolchain() -> str | None:
    for candidate in (check.default_toolchain(), "/opt/swift"):
        if candidate and check.find_interfaces(candidate):
            return candidate
    return None


@unittest.skipUnless(real_toolchain(), "no Swift toolchain with linux .swiftinterface files found")
class TestRealToolchain(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.toolchain = real_toolchain()
        cls.table, _ = check.build_table(check.find_interfaces(cls.toolchain))

    def test_known_requirements(self):
        def req(name):
            return check.vstr(self.table[name].req["ios"]), check.vstr(self.table[name].req["macos"])

        self.assertEqual(req("Mutex"), ("18.0", "15.0"))
        self.assertEqual(self.table["Mutex"].modules, ["Synchronization"])
        self.assertEqual(req("withLock"), ("18.0", "15.0"))
        self.assertEqual(req("InlineArray"), ("26.0", "26.0"))
        self.assertEqual(req("withCheckedContinuation"), ("13.0", "10.15"))  # @backDeployed(before: macOS 15)
        self.assertLess(self.table["Span"].req["ios"], (17,))  # back-deployed to iOS 12.2 in the interface

    def test_package18_with_the_real_interfaces(self):
        code, report = run_json("--package", PKG18, "--toolchain", self.toolchain)
        self.assertEqual(code, 1)
        self.assertEqual(found(report), expected(PKG18))

    def test_package17_unguarded_mutex_with_the_real_interfaces(self):
        _, report = run_json("--package", PKG17, "--toolchain", self.toolchain)
        line = line_of(PKG17, "Cases.swift", "let unguarded = Mutex")
        self.assertIn(("Cases.swift", line, "Mutex", "ios,macos"), found(report))
        self.assertNotIn(line_of(PKG17, "Cases.swift", "let lock = Mutex"), {f[1] for f in found(report)})


if __name__ == "__main__":
    unittest.main()
