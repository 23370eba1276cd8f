#!/usr/bin/env python3
"""Self-test of check.py: `python3 Tools/package-deps/test_check.py`. Each case builds a small package tree and a
synthetic `dump-package` document in a temporary directory."""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check  # noqa: E402

SHIMS = {"BackgroundTasks": "BackgroundTasksShim"}


def target(name, dependencies, kind="regular", path=None):
    deps = []
    for dependency in dependencies:
        if dependency.startswith("product:"):
            deps.append({"product": [dependency[len("product:"):], "some-package", None, None]})
        elif dependency.startswith("linux:"):
            deps.append({"target": [dependency[len("linux:"):], {"platformNames": ["linux"]}]})
        else:
            deps.append({"byName": [dependency, None]})
    return {"name": name, "type": kind, "dependencies": deps, "path": path}


class CheckTests(unittest.TestCase):
    def package(self, files, targets):
        directory = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(directory))
        for path, text in files.items():
            full = os.path.join(directory, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as handle:
                handle.write(text)
        return check.check({"targets": targets}, directory, SHIMS)

    def test_agreeing_package_has_no_problems(self):
        problems = self.package(
            {
                "Sources/A/a.swift": "import Foundation\n",
                "Sources/B/b.swift": "public import A\n@_spi(X) import Logging\nimport struct A.Thing\n",
                "Tests/BTests/t.swift": "@testable import B\nimport Testing\n",
            },
            [target("A", []), target("B", ["A", "product:Logging"]), target("BTests", ["B"], kind="test")],
        )
        self.assertEqual(problems, [])

    def test_missing_and_unused_are_both_reported(self):
        problems = self.package(
            {"Sources/A/a.swift": "", "Sources/B/b.swift": "import A\nimport NIOCore\n"},
            [target("A", []), target("B", ["product:Crypto"])],
        )
        self.assertEqual(
            problems,
            [
                "B: imports A but does not declare it (add the target to its dependencies)",
                "B: imports NIOCore but does not declare it (add the product to its dependencies)",
                "B: declares Crypto but no file imports it (remove it from its dependencies)",
            ],
        )

    def test_comments_and_multiline_strings_are_not_imports(self):
        problems = self.package(
            {"Sources/A/a.swift": '// import Gone\n/* import Gone2 */\nlet script = """\n    import json\n    """\nlet raw = #"""\nimport sys\n"""#\n'},
            [target("A", [])],
        )
        self.assertEqual(problems, [])

    def test_apple_frameworks_count_as_their_shims(self):
        files = {"Sources/App/app.swift": "import BackgroundTasks\n"}
        self.assertEqual(self.package(files, [target("App", ["linux:BackgroundTasksShim"])]), [])
        self.assertEqual(
            self.package(files, [target("App", [])]),
            ["App: imports BackgroundTasksShim but does not declare it (add the product to its dependencies)"],
        )
        self.assertEqual(
            self.package({"Sources/App/app.swift": "import Foundation\n"}, [target("App", ["linux:BackgroundTasksShim"])]),
            ["App: declares BackgroundTasksShim but no file imports it (remove it from its dependencies)"],
        )

    def test_custom_paths_and_c_targets(self):
        problems = self.package(
            {"Examples/App/main.swift": "import K\n", "Sources/K/k.c": "int k;\n", "Sources/K/include/k.h": "int k;\n"},
            [target("K", []), target("App", ["K"], kind="executable", path="Examples/App")],
        )
        self.assertEqual(problems, [])

    def test_a_missing_directory_is_a_problem(self):
        self.assertEqual(self.package({}, [target("Ghost", [])]), ["Ghost: no directory Sources/Ghost"])

    def test_main_reads_a_dump_and_sets_the_exit_status(self):
        directory = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(directory))
        os.makedirs(os.path.join(directory, "Sources", "A"))
        with open(os.path.join(directory, "Sources", "A", "a.swift"), "w", encoding="utf-8") as handle:
            handle.write("import Missing\n")
        with open(os.path.join(directory, "Package.swift"), "w", encoding="utf-8") as handle:
            handle.write("// no shims\n")
        dump = os.path.join(directory, "dump.json")
        with open(dump, "w", encoding="utf-8") as handle:
            json.dump({"targets": [target("A", [])]}, handle)
        self.assertEqual(check.main(["--package-dir", directory, "--dump", dump]), 1)
        with open(os.path.join(directory, "Sources", "A", "a.swift"), "w", encoding="utf-8") as handle:
            handle.write("import Foundation\n")
        self.assertEqual(check.main(["--package-dir", directory, "--dump", dump]), 0)


if __name__ == "__main__":
    unittest.main()
