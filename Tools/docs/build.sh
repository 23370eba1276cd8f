#!/usr/bin/env bash
# Builds the documentation catalogs (Sources/<Module>/<Module>.docc) with DocC and fails on any warning: a symbol link
# (``Type/member``) or an article link (<doc:…>) that does not resolve, in a catalog or in a doc comment of the module
# it documents.
#
# It compiles nothing. It reads the modules the last debug build left in .build (run after `swift test`, or
# `swift build --build-tests`), extracts each documented module's symbol graph with swift-symbolgraph-extract, using
# the search paths and C module maps SwiftPM compiled that module with (from .build/debug.yaml), and converts its
# catalog with `docc convert --warnings-as-errors`. That costs seconds per catalog, where swift-docc-plugin would build
# every target again.
#
# Usage: Tools/docs/build.sh [Module …]    (default: every module with a catalog)
# ORCHARD_DOCS_OUTPUT=DIR keeps the built archives (DIR/<Module>.doccarchive); otherwise they are discarded.
set -euo pipefail
cd "$(dirname "$0")/../.."

toolchain=$(dirname "$(readlink -f "$(command -v swift)")")
extract=${SWIFT_SYMBOLGRAPH_EXTRACT:-$toolchain/swift-symbolgraph-extract}
docc=${DOCC:-$toolchain/docc}
triple=$(swiftc -print-target-info | python3 -c 'import json, sys; print(json.load(sys.stdin)["target"]["unversionedTriple"])')
modules_dir=.build/$triple/debug/Modules
manifest=.build/debug.yaml

if [ $# -gt 0 ]; then
    modules=("$@")
else
    modules=()
    for catalog in Sources/*/*.docc; do
        modules+=("$(basename "$(dirname "$catalog")")")
    done
fi

for module in "${modules[@]}"; do
    [ -d "Sources/$module/$module.docc" ] || { echo "docs: no catalog Sources/$module/$module.docc" >&2; exit 2; }
    [ -e "$modules_dir/$module.swiftmodule" ] || {
        echo "docs: $modules_dir/$module.swiftmodule is missing: run \`swift build --build-tests\` (or \`swift test\`) first" >&2
        exit 2
    }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
output=${ORCHARD_DOCS_OUTPUT:-$work/archives}
mkdir -p "$output"

# The flags each module was compiled with that symbol-graph extraction needs too: import search paths, and the clang
# options that find C modules (module maps and include directories: COrchardKernels, NIO's, BoringSSL's, …). One file
# per module, one argument per line.
python3 - "$manifest" "$work" "${modules[@]}" <<'PY'
import json, sys
manifest, work, modules = sys.argv[1], sys.argv[2], set(sys.argv[3:])
lines = open(manifest).read().split("\n")
found = set()
for i, line in enumerate(lines):
    line = line.strip()
    if not line.startswith("description: \"Compiling Swift Module '"):
        continue
    module = line.split("'")[1]
    if module not in modules:
        continue
    args = json.loads(lines[i + 1].strip()[len("args: "):])
    kept = []
    for flag, value in zip(args, args[1:] + [""]):
        if flag in ("-I", "-Xcc", "-module-cache-path"):
            kept += [flag, value]
    open(f"{work}/{module}.args", "w").write("\n".join(kept) + "\n")
    found.add(module)
missing = modules - found
if missing:
    sys.exit(f"docs: {manifest} has no compile command for {', '.join(sorted(missing))}: build the package first")
PY

failed=()
start=$SECONDS
for module in "${modules[@]}"; do
    began=$SECONDS
    graphs=$work/graphs/$module
    mkdir -p "$graphs"
    mapfile -t flags <"$work/$module.args"
    if ! "$extract" -module-name "$module" -target "$triple" -minimum-access-level public -emit-extension-block-symbols \
        -output-dir "$graphs" "${flags[@]}" >"$work/$module.extract.log" 2>&1; then
        cat "$work/$module.extract.log" >&2
        failed+=("$module (symbol graph)")
        continue
    fi
    if "$docc" convert "Sources/$module/$module.docc" --additional-symbol-graph-dir "$graphs" \
        --fallback-display-name "$module" --fallback-bundle-identifier "dev.orchard.$module" \
        --output-path "$output/$module.doccarchive" --warnings-as-errors >"$work/$module.docc.log" 2>&1; then
        echo "docs: $module ok ($((SECONDS - began)) s)"
    else
        # DocC names files relative to the catalog: name them from the repository's root instead.
        sed -e "s|--> \.\./|--> Sources/$module/|" -e "s|--> \([^./][^ ]*\.md:\)|--> Sources/$module/$module.docc/\1|" \
            "$work/$module.docc.log" >&2
        echo "docs: $module FAILED ($((SECONDS - began)) s)" >&2
        failed+=("$module")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "docs: ${#failed[@]} of ${#modules[@]} catalog(s) have broken links or other warnings: ${failed[*]} ($((SECONDS - start)) s)" >&2
    exit 1
fi
echo "docs: ${#modules[@]} catalog(s) built without warnings ($((SECONDS - start)) s)"
