#!/usr/bin/env python3
"""No-Mac availability check for a Swift package.

Reads the toolchain's standard-library interfaces (<toolchain>/usr/lib/swift/linux/*.swiftmodule/*.swiftinterface),
builds a table of API names that need a newer iOS/macOS than Package.swift declares, and reports every use of such a
name in the package's sources that no enclosing `@available(...)`, `if #available(...)` or `guard #available(...)`
covers. Token level, not a type checker: see README.md next to this file for what that means.

Python 3.11, standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field

PLATFORMS = ("ios", "macos")
PLATFORM_LABEL = {"ios": "iOS", "macos": "macOS"}
# Spellings accepted in @available / #available for the two platforms this check covers. Application-extension and
# Mac Catalyst variants are ignored (they only narrow further).
PLATFORM_NAMES = {"iOS": "ios", "macOS": "macos", "OSX": "macos"}
# SwiftPM's minimum deployment targets when Package.swift names no platform.
SWIFTPM_DEFAULT = {"ios": "12.0", "macos": "10.13"}
# Modules every Swift file sees without an import.
IMPLICIT_MODULES = {"Swift", "_Concurrency", "_StringProcessing", "SwiftOnoneSupport", "_Builtin_float"}
UNAVAILABLE = (10_000,)  # "version" of a platform on which a declaration/context is unavailable

Version = tuple  # tuple[int, ...], trailing zeros stripped


def parse_version(text: str) -> Version | None:
    text = text.strip().strip('"').replace("_", ".")
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        return None
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def vstr(v: Version | None, pad: bool = True) -> str:
    if v is None:
        return "-"
    parts = list(v)
    if pad and len(parts) == 1:
        parts.append(0)
    return ".".join(str(p) for p in parts)


# ---------------------------------------------------------------------------------------------------------------------
# Comments and string literals
# ---------------------------------------------------------------------------------------------------------------------

_CODE_STOP = re.compile(r'//|/\*|(#*)"|\(|\)')
_BLANK = re.compile(r"[^\n]")


def _blank(s: str) -> str:
    return _BLANK.sub(" ", s)


def strip_comments_and_strings(text: str) -> str:
    """Same length and line structure as `text`, with comments and string-literal contents replaced by spaces.

    Handles nested block comments, "..." / \"\"\"...\"\"\" / #"..."# raw strings, and keeps the code inside string
    interpolations (`\\(...)`), which can contain real uses.
    """
    out: list[str] = []
    pos = _strip_code(text, 0, out, nested=False)
    if pos < len(text):  # unbalanced ')' at the top level never stops the scan, so this is only a safety net
        out.append(text[pos:])
    result = "".join(out)
    assert len(result) == len(text)
    return result


def _strip_code(text: str, pos: int, out: list[str], nested: bool) -> int:
    """Copy code from `pos`; if `nested` (inside an interpolation), stop after the ')' that closes it."""
    depth = 0
    n = len(text)
    while True:
        m = _CODE_STOP.search(text, pos)
        if m is None:
            out.append(text[pos:])
            return n
        tok = m.group(0)
        start = m.start()
        out.append(text[pos:start])
        if tok == "//":
            end = text.find("\n", start)
            end = n if end < 0 else end
            out.append(_blank(text[start:end]))
            pos = end
        elif tok == "/*":
            end = _block_comment_end(text, start)
            out.append(_blank(text[start:end]))
            pos = end
        elif tok == "(":
            depth += 1
            out.append(tok)
            pos = m.end()
        elif tok == ")":
            out.append(tok)
            pos = m.end()
            if depth == 0 and nested:
                return pos
            depth = max(0, depth - 1)
        else:  # string literal, possibly raw (#"), possibly multi-line (""")
            hashes = len(m.group(1))
            pos = _strip_string(text, start, hashes, out)


def _block_comment_end(text: str, start: int) -> int:
    depth = 0
    i = start
    n = len(text)
    while i < n:
        if text.startswith("/*", i):
            depth += 1
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return n


def _strip_string(text: str, start: int, hashes: int, out: list[str]) -> int:
    n = len(text)
    quote_at = start + hashes
    multi = text.startswith('"""', quote_at)
    opener = '"""' if multi else '"'
    closer = opener + "#" * hashes
    escape = "\\" + "#" * hashes
    i = quote_at + len(opener)
    out.append(_blank(text[start:i]))
    seg_start = i
    while i < n:
        c = text[i]
        if c == "\\" and text.startswith(escape, i):
            j = i + len(escape)
            if j < n and text[j] == "(":  # interpolation: the inside is code
                out.append(_blank(text[seg_start:j + 1]))
                i = _strip_code(text, j + 1, out, nested=True)
                seg_start = i
                continue
            i = j + 1
            continue
        if c == '"' and text.startswith(closer, i):
            end = i + len(closer)
            out.append(_blank(text[seg_start:end]))
            return end
        if c == "\n" and not multi:  # unterminated single-line string: stop at the line end
            out.append(_blank(text[seg_start:i]))
            return i
        i += 1
    out.append(_blank(text[seg_start:n]))
    return n


# ---------------------------------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<nl>\n)
      |(?P<ws>[ \t\r\f\v]+)
      |(?P<id>`[^`\n]+`|[^\W\d]\w*|\$\w+)
      |(?P<num>\d[\w]*(?:\.\d[\w]*)*)
      |(?P<hash>\#[^\W\d]\w*)
      |(?P<at>@[^\W\d]\w*)
      |(?P<p>->|\.\.\.|\.\.<|&&|\|\||[{}()\[\]<>.,:;=?!&|*])
      |(?P<other>.)""",
    re.VERBOSE,
)


@dataclass(slots=True)
class Tok:
    kind: str  # nl id num hash at p other
    text: str
    line: int
    col: int
    bol: bool  # first token on its line


def tokenize(code: str) -> list[Tok]:
    toks: list[Tok] = []
    line = 1
    line_start = 0
    bol = True
    for m in _TOKEN.finditer(code):
        kind = m.lastgroup
        if kind == "ws":
            continue
        if kind == "nl":
            toks.append(Tok("nl", "\n", line, m.start() - line_start + 1, bol))
            line += 1
            line_start = m.end()
            bol = True
            continue
        text = m.group(0)
        if kind == "id" and text.startswith("`"):
            text = text[1:-1]
        toks.append(Tok(kind, text, line, m.start() - line_start + 1, bol))
        bol = False
    return toks


def _matching(toks: list[Tok], i: int, open_: str, close: str) -> int:
    """Index of the token closing the group opened at toks[i] (or len(toks))."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if toks[j].kind != "p":
            continue
        if t == open_:
            depth += 1
        elif t == close:
            depth -= 1
            if depth == 0:
                return j
    return len(toks)


# ---------------------------------------------------------------------------------------------------------------------
# Availability specs: @available(...), #available(...), #unavailable(...)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Availability:
    introduced: dict = field(default_factory=dict)  # platform -> Version
    unavailable: set = field(default_factory=set)  # platforms ('*' for all)
    swift_obsoleted: Version | None = None
    platform_spec: bool = False  # mentions iOS/macOS with a version (short or long form)

    def merge(self, other: "Availability") -> None:
        for p, v in other.introduced.items():
            if p not in self.introduced or v > self.introduced[p]:
                self.introduced[p] = v
        self.unavailable |= other.unavailable
        if other.swift_obsoleted is not None:
            self.swift_obsoleted = other.swift_obsoleted
        self.platform_spec |= other.platform_spec


def parse_availability_args(toks: list[Tok]) -> Availability:
    """Parse the tokens between the parentheses of @available(...) / #available(...)."""
    items: list[list[Tok]] = [[]]
    depth = 0
    for t in toks:
        if t.kind == "nl":
            continue
        if t.kind == "p" and t.text in "([":
            depth += 1
        elif t.kind == "p" and t.text in ")]":
            depth -= 1
        if depth == 0 and t.kind == "p" and t.text == ",":
            items.append([])
        else:
            items[-1].append(t)
    items = [it for it in items if it]
    av = Availability()
    if not items:
        return av
    first = items[0]
    # Long form: `@available(iOS, introduced: 18.0)`, `@available(*, unavailable)`, `@available(swift, obsoleted: 5)`
    long_form = len(first) == 1 and len(items) > 1 and (
        first[0].text == "*" or any(len(it) >= 1 and it[0].text in ("introduced", "deprecated", "obsoleted",
                                                                  "unavailable", "message", "renamed", "noasync")
                                    for it in items[1:]))
    if long_form:
        plat = first[0].text
        for it in items[1:]:
            key = it[0].text
            value = "".join(t.text for t in it[2:]) if len(it) >= 3 and it[1].text == ":" else ""
            if key == "unavailable":
                if plat == "*":
                    av.unavailable.add("*")
                elif plat in PLATFORM_NAMES:
                    av.unavailable.add(PLATFORM_NAMES[plat])
            elif key == "introduced" and plat in PLATFORM_NAMES:
                v = parse_version(value)
                if v is not None:
                    av.introduced[PLATFORM_NAMES[plat]] = v
                    av.platform_spec = True
            elif key == "obsoleted" and plat == "swift":
                av.swift_obsoleted = parse_version(value)
            elif key == "obsoleted" and plat in PLATFORM_NAMES:
                av.unavailable.add(PLATFORM_NAMES[plat])  # obsoleted on the platform: not usable any more
        return av
    # Short form: `@available(macOS 15.0, iOS 18.0, *)`, `@available(swift 5)`
    for it in items:
        if len(it) >= 2 and it[0].text in PLATFORM_NAMES:
            v = parse_version("".join(t.text for t in it[1:]))
            if v is not None:
                av.introduced[PLATFORM_NAMES[it[0].text]] = v
                av.platform_spec = True
    return av


# ---------------------------------------------------------------------------------------------------------------------
# Interface files -> API table
# ---------------------------------------------------------------------------------------------------------------------

TYPE_KEYWORDS = {"struct", "class", "enum", "protocol", "extension", "actor"}
MEMBER_KEYWORDS = {"func", "var", "let", "typealias", "case", "macro", "init", "deinit", "subscript", "associatedtype",
                   "operator", "precedencegroup", "import"}
DECL_KEYWORDS = TYPE_KEYWORDS | MEMBER_KEYWORDS
MODIFIERS = {"public", "open", "internal", "private", "fileprivate", "package", "static", "class", "final", "override",
             "mutating", "nonmutating", "dynamic", "optional", "required", "convenience", "lazy", "weak", "unowned",
             "indirect", "nonisolated", "isolated", "distributed", "prefix", "postfix", "infix", "consuming",
             "borrowing", "__consuming", "__owned", "__shared", "async", "sending"}


@dataclass
class Decl:
    name: str
    module: str
    kind: str
    req: dict  # platform -> Version | None (None: unavailable on that platform)
    path: str
    line: int
    parent: str | None  # enclosing type/extension/protocol name; None at the top level


@dataclass
class _IScope:
    kind: str
    req: dict  # platform -> Version (UNAVAILABLE if unavailable)
    public: bool
    ignored: bool  # SPI, unavailable, underscored or non-public type: nothing inside is API
    type_name: str | None = None


def find_interfaces(toolchain: str) -> list[tuple[str, str]]:
    """[(module, path)] of the public (not .private/.package) interfaces under <toolchain>/usr/lib/swift/linux."""
    candidates = [os.path.join(toolchain, "usr", "lib", "swift", "linux"),
                  os.path.join(toolchain, "lib", "swift", "linux")]
    found: list[tuple[str, str]] = []
    for root in candidates:
        if not os.path.isdir(root):
            continue
        for entry in sorted(os.listdir(root)):
            full = os.path.join(root, entry)
            if entry.endswith(".swiftmodule") and os.path.isdir(full):
                module = entry[: -len(".swiftmodule")]
                for f in sorted(os.listdir(full)):
                    if f.endswith(".swiftinterface") and not f.endswith((".private.swiftinterface",
                                                                           ".package.swiftinterface")):
                        found.append((module, os.path.join(full, f)))
            elif entry.endswith(".swiftinterface") and not entry.endswith((".private.swiftinterface",
                                                                            ".package.swiftinterface")):
                found.append((entry.split(".")[0], full))
        if found:
            break
    return found


def _read_attributes(toks: list[Tok], i: int) -> tuple[str, list[Tok], int]:
    """At an '@name' token: return (name, argument tokens, index after the attribute)."""
    name = toks[i].text[1:]
    j = i + 1
    if j < len(toks) and toks[j].kind == "p" and toks[j].text == "(" and toks[j].line == toks[i].line \
            and toks[j].col == toks[i].col + len(toks[i].text):
        end = _matching(toks, j, "(", ")")
        return name, toks[j + 1:end], end + 1
    return name, [], j


def parse_interface(path: str, module: str) -> list[Decl]:
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    toks = tokenize(strip_comments_and_strings(text))
    base = {p: () for p in PLATFORMS}
    stack = [_IScope("top", dict(base), True, False)]
    decls: list[Decl] = []
    attrs: list[tuple[str, list[Tok]]] = []
    mods: set[str] = set()
    n = len(toks)
    i = 0
    while i < n:
        t = toks[i]
        if t.kind == "nl":
            i += 1
            continue
        if t.kind == "hash":  # #if / #else / #endif lines: parse every branch (each is balanced)
            if t.text in ("#else", "#elseif"):
                attrs, mods = [], set()
            while i < n and toks[i].kind != "nl":
                i += 1
            continue
        if t.kind == "p" and t.text == "}":
            if len(stack) > 1:
                stack.pop()
            attrs, mods = [], set()
            i += 1
            continue
        if t.kind == "at":
            name, args, i = _read_attributes(toks, i)
            attrs.append((name, args))
            continue
        if t.kind == "id" and t.text in MODIFIERS and not (
                t.text == "class" and not (i + 1 < n and toks[i + 1].text in DECL_KEYWORDS | MODIFIERS)):
            mods.add(t.text)
            i += 1
            if i < n and toks[i].text == "(" and toks[i].line == t.line:  # private(set), nonisolated(unsafe)
                i = _matching(toks, i, "(", ")") + 1
            continue
        if t.kind == "id" and t.text in DECL_KEYWORDS:
            i = _interface_decl(toks, i, module, path, stack, attrs, mods, decls)
            attrs, mods = [], set()
            continue
        # Anything else at declaration level (should not happen in a well-formed interface): skip the line.
        while i < n and toks[i].kind != "nl":
            if toks[i].text == "{":
                i = _matching(toks, i, "{", "}")
            i += 1
        attrs, mods = [], set()
    return decls


def _interface_decl(toks, i, module, path, stack, attrs, mods, decls) -> int:
    n = len(toks)
    kw = toks[i].text
    line = toks[i].line
    scope = stack[-1]
    av = Availability()
    spi = False
    for name, args in attrs:
        if name == "available":
            av.merge(parse_availability_args(args))
        elif name in ("_spi", "_spi_available"):
            spi = True
        # @backDeployed(before:) needs nothing: the decl's own @available is the usable floor.
        # @_originallyDefinedIn only records where the symbol used to live; it does not change availability.
    req = {}
    for p in PLATFORMS:
        if "*" in av.unavailable or p in av.unavailable or scope.req[p] == UNAVAILABLE:
            req[p] = UNAVAILABLE
        else:
            own = av.introduced.get(p, ())
            req[p] = max(own, scope.req[p])
    obsolete = av.swift_obsoleted is not None and av.swift_obsoleted < (6,)
    access_public = bool(mods & {"public", "open"}) or (scope.kind in ("protocol",) and scope.public) \
        or (kw == "case" and scope.kind == "enum" and scope.public) or kw == "extension"
    ignored = scope.ignored or spi or not access_public or obsolete

    # Names declared here.
    names: list[str] = []
    j = i + 1
    if kw in ("struct", "class", "enum", "protocol", "actor", "typealias", "func", "macro", "associatedtype"):
        if j < n and toks[j].kind == "id":
            names.append(toks[j].text)
    elif kw in ("var", "let"):
        k = j
        if k < n and toks[k].text == "(":
            end = _matching(toks, k, "(", ")")
            names += [x.text for x in toks[k + 1:end] if x.kind == "id"]
        elif k < n and toks[k].kind == "id":
            names.append(toks[k].text)
    elif kw == "case":
        k = j
        expect_name = True
        while k < n and toks[k].kind != "nl":
            x = toks[k]
            if x.text == "(":
                k = _matching(toks, k, "(", ")") + 1
                continue
            if expect_name and x.kind == "id":
                names.append(x.text)
                expect_name = False
            elif x.text == ",":
                expect_name = True
            k += 1
    ext_type = ""
    if kw == "extension":
        k = j
        parts = []
        while k < n and (toks[k].kind == "id" or toks[k].text == "."):
            if toks[k].kind == "id":
                parts.append(toks[k].text)
            k += 1
        ext_type = parts[-1] if parts else ""

    # Header: to the end of the line (interface headers are single-line), or to the first '{' at depth 0.
    depth = 0
    k = i + 1
    body_at = None
    while k < n:
        x = toks[k]
        if x.kind == "nl" and depth == 0:
            break
        if x.kind == "p":
            if x.text in "([":
                depth += 1
            elif x.text in ")]":
                depth -= 1
            elif x.text == "{" and depth == 0:
                body_at = k
                break
        k += 1

    if not ignored and kw not in ("extension", "init", "deinit", "subscript", "operator", "precedencegroup",
                                  "import"):
        for name in names:
            if name.startswith("_") or name.startswith("$"):
                continue
            decls.append(Decl(name, module, kw, {p: (None if req[p] == UNAVAILABLE else req[p]) for p in PLATFORMS},
                              path, line, scope.type_name))

    if body_at is None:
        return k
    if kw in TYPE_KEYWORDS:
        type_name = ext_type if kw == "extension" else (names[0] if names else "")
        child_ignored = ignored or type_name.startswith("_")
        child_public = bool(mods & {"public", "open"}) or kw == "extension"
        stack.append(_IScope(kw, req, child_public, child_ignored, type_name))
        return body_at + 1
    # Function / accessor / initialiser body: skip it.
    return _matching(toks, body_at, "{", "}") + 1


@dataclass
class ApiEntry:
    name: str
    req: dict  # platform -> Version | None  (min over declarations usable on that platform)
    modules: list
    decl_count: int
    top_level: bool  # some declaration is not nested in a type (usable as a bare name anywhere)
    parents: set  # types/protocols declaring it as a member (a bare use needs one of them in context)


def build_table(interfaces: list[tuple[str, str]]) -> tuple[dict, int]:
    """name -> ApiEntry with the minimum requirement per platform over all declarations of that name."""
    by_name: dict[str, list[Decl]] = {}
    for module, path in interfaces:
        for d in parse_interface(path, module):
            by_name.setdefault(d.name, []).append(d)
    table: dict[str, ApiEntry] = {}
    for name, decls in by_name.items():
        req = {}
        for p in PLATFORMS:
            usable = [d.req[p] for d in decls if d.req[p] is not None]
            req[p] = min(usable) if usable else None
        modules = []
        for d in decls:
            if any(d.req[p] is not None and d.req[p] == req[p] for p in PLATFORMS) and d.module not in modules:
                modules.append(d.module)
        table[name] = ApiEntry(name, req, modules or sorted({d.module for d in decls}), len(decls),
                               any(d.parent is None for d in decls), {d.parent for d in decls if d.parent})
    return table, len(by_name)


# ---------------------------------------------------------------------------------------------------------------------
# Package.swift
# ---------------------------------------------------------------------------------------------------------------------


def uses_member_import_visibility(package_swift: str) -> bool:
    """Whether Package.swift enables the MemberImportVisibility upcoming feature (members need a direct import)."""
    with open(package_swift, encoding="utf-8") as f:
        return "MemberImportVisibility" in strip_comments_and_strings_keep_quotes(f.read())


def read_platforms(package_swift: str) -> dict:
    """platform -> version string ('17', '10.15', '17.0') declared in Package.swift's platforms, if any."""
    with open(package_swift, encoding="utf-8") as f:
        code = strip_comments_and_strings_keep_quotes(f.read())
    found = {}
    for m in re.finditer(r'\.(macOS|iOS)\(\s*(?:\.v([0-9_]+)|"([0-9.]+)")\s*\)', code):
        plat = PLATFORM_NAMES[m.group(1)]
        if plat not in found:
            found[plat] = m.group(2).replace("_", ".") if m.group(2) else m.group(3)
    return found


def strip_comments_and_strings_keep_quotes(text: str) -> str:
    """Strip comments only (Package.swift's `.iOS("17.0")` form needs its string)."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(_blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = _block_comment_end(text, i)
            out.append(_blank(text[i:j]))
            i = j
        elif text[i] == '"':
            j = text.find('"', i + 1)
            j = n if j < 0 else j + 1
            out.append(text[i:j])
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------------------
# #if conditions (per platform: True, False or None = unknown)
# ---------------------------------------------------------------------------------------------------------------------

NON_APPLE_OS = {"Linux", "Windows", "Android", "FreeBSD", "OpenBSD", "WASI", "none", "Cygwin", "Haiku", "PS4", "tvOS",
                "watchOS", "visionOS", "xrOS"}
APPLE_MODULES = {"Darwin", "Foundation", "Dispatch", "ObjectiveC", "Combine", "SwiftUI", "CoreFoundation", "os",
                 "OSLog", "Network", "CoreML", "Security", "CryptoKit", "Accelerate", "Metal", "CoreGraphics",
                 "Observation", "CoreData", "MetricKit", "NaturalLanguage", "Vision", "CoreImage", "QuartzCore",
                 "UniformTypeIdentifiers", "Synchronization", "RegexBuilder", "Distributed"}
NON_APPLE_MODULES = {"Glibc", "Musl", "WinSDK", "Android", "Bionic", "WASILibc", "ucrt", "CRT", "FoundationEssentials"}
_COND_TOKEN = re.compile(r"\s*(\|\||&&|!|\(|\)|,|[<>=]+|[A-Za-z_$][\w.$]*|[\d.]+)")


def eval_condition(text: str, platform: str):
    tokens = [m.group(1) for m in _COND_TOKEN.finditer(text)]
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def t_or(a, b):
        if a is True or b is True:
            return True
        if a is False and b is False:
            return False
        return None

    def t_and(a, b):
        if a is False or b is False:
            return False
        if a is True and b is True:
            return True
        return None

    def expr():
        v = conj()
        while peek() == "||":
            take()
            v = t_or(v, conj())
        return v

    def conj():
        v = unary()
        while peek() == "&&":
            take()
            v = t_and(v, unary())
        return v

    def unary():
        if peek() == "!":
            take()
            v = unary()
            return None if v is None else not v
        return atom()

    def atom():
        tok = take() if peek() is not None else None
        if tok is None:
            return None
        if tok == "(":
            v = expr()
            if peek() == ")":
                take()
            return v
        if tok == "true":
            return True
        if tok == "false":
            return False
        args = []
        if peek() == "(":
            take()
            depth = 1
            while peek() is not None and depth:
                a = take()
                if a == "(":
                    depth += 1
                elif a == ")":
                    depth -= 1
                    if depth == 0:
                        break
                args.append(a)
        arg = args[0] if args else ""
        if tok == "os":
            if arg == "iOS":
                return platform == "ios"
            if arg in ("macOS", "OSX"):
                return platform == "macos"
            if arg in NON_APPLE_OS:
                return False
            return None
        if tok == "canImport":
            if arg in APPLE_MODULES:
                return True
            if arg == "UIKit":
                return platform == "ios"
            if arg == "AppKit":
                return platform == "macos"
            if arg in NON_APPLE_MODULES:
                return False
            return None
        return None  # compiler(), swift(), arch(), targetEnvironment(), hasFeature(), $Feature, DEBUG, ...

    try:
        return expr()
    except Exception:  # malformed condition: assume it may be compiled
        return None


# ---------------------------------------------------------------------------------------------------------------------
# Project sources
# ---------------------------------------------------------------------------------------------------------------------

class IfTracker:
    """Which platforms compile the code at this point of a file, through `#if` / `#elseif` / `#else` / `#endif`."""

    def __init__(self):
        self.stack: list[dict] = []  # per #if: {'parent': {p: bool}, 'taken': {p: bool}}
        self.active = {p: True for p in PLATFORMS}

    def step(self, directive: str, cond_text: str) -> None:
        if directive == "#if":
            values = {p: eval_condition(cond_text, p) for p in PLATFORMS}
            frame = {"parent": dict(self.active), "taken": {p: values[p] is True for p in PLATFORMS}}
            self.stack.append(frame)
            self.active = {p: frame["parent"][p] and values[p] is not False for p in PLATFORMS}
        elif self.stack:
            frame = self.stack[-1]
            if directive == "#endif":
                self.stack.pop()
                self.active = frame["parent"]
            elif directive == "#else":
                self.active = {p: frame["parent"][p] and not frame["taken"][p] for p in PLATFORMS}
                frame["taken"] = {p: True for p in PLATFORMS}
            else:
                values = {p: eval_condition(cond_text, p) for p in PLATFORMS}
                self.active = {p: frame["parent"][p] and not frame["taken"][p] and values[p] is not False
                               for p in PLATFORMS}
                frame["taken"] = {p: frame["taken"][p] or values[p] is True for p in PLATFORMS}


def apple_compiled_tokens(toks: list[Tok]) -> list[Tok]:
    """The tokens compiled for at least one Apple platform: code under `#if os(Linux)` (the project's Linux-only
    stand-ins for Apple frameworks, say) declares nothing an Apple build sees, so its names must not hide uses."""
    kept: list[Tok] = []
    tracker = IfTracker()
    n = len(toks)
    i = 0
    while i < n:
        t = toks[i]
        if t.kind == "hash" and t.text in ("#if", "#elseif", "#else", "#endif"):
            j = i + 1
            while j < n and toks[j].kind != "nl":
                j += 1
            tracker.step(t.text, " ".join(x.text for x in toks[i + 1:j]))
            kept.extend(toks[i:j])
            i = j
            continue
        if any(tracker.active.values()):
            kept.append(t)
        i += 1
    return kept


def project_declared_names(toks: list[Tok]) -> set:
    """Names the project declares: decl names, enum cases, parameters, closure/for bindings, generic parameters."""
    names: set = set()
    n = len(toks)
    for i, t in enumerate(toks):
        if t.kind != "id":
            continue
        kw = t.text
        nxt = toks[i + 1] if i + 1 < n else None
        if kw in ("func", "var", "let", "class", "struct", "enum", "protocol", "typealias", "actor", "associatedtype",
                  "macro") and nxt is not None:
            if nxt.kind == "id" and not (kw == "class" and nxt.text in DECL_KEYWORDS | MODIFIERS):
                names.add(nxt.text)
                k = i + 2
                if k < n and toks[k].text == "<":  # generic parameters
                    _collect_generics(toks, k, names)
            elif nxt.text == "(" and kw in ("var", "let"):  # let (a, b) = ...
                end = _matching(toks, i + 1, "(", ")")
                names.update(x.text for x in toks[i + 2:end] if x.kind == "id")
            if kw in ("func", "init", "subscript"):
                _collect_params(toks, i, names)
        elif kw in ("init", "subscript"):
            _collect_params(toks, i, names)
        elif kw == "case" and t.bol and nxt is not None and nxt.kind == "id" and nxt.text not in ("let", "var", "is",
                                                                                                 "_"):
            k = i + 1
            expect = True
            while k < n and toks[k].kind != "nl" and toks[k].text not in (":", "{", "}"):
                x = toks[k]
                if x.text == "(":
                    k = _matching(toks, k, "(", ")") + 1
                    continue
                if expect and x.kind == "id":
                    names.add(x.text)
                    expect = False
                elif x.text == ",":
                    expect = True
                elif x.text == "=":
                    expect = False
                k += 1
        elif kw == "for":
            k = i + 1
            while k < n and toks[k].text != "in" and toks[k].kind != "nl" and k < i + 20:
                x = toks[k]
                if x.kind == "id" and x.text not in ("case", "let", "var", "_") and toks[k - 1].text in (
                        "for", "(", ",", "let", "var") and toks[k + 1].text in (",", ")", "in", ":"):
                    names.add(x.text)
                k += 1
        elif kw == "in" and i > 0:
            _collect_closure_params(toks, i, names)
    return names


def _collect_generics(toks, k, names):
    depth = 0
    for j in range(k, min(len(toks), k + 60)):
        x = toks[j]
        if x.text == "<":
            depth += 1
        elif x.text == ">":
            depth -= 1
            if depth == 0:
                return
        elif x.kind == "id" and depth == 1 and toks[j - 1].text in ("<", ",", "each", "let"):
            if x.text not in ("each", "let"):
                names.add(x.text)


def _collect_params(toks, i, names):
    n = len(toks)
    k = i + 1
    while k < n and toks[k].text != "(" and toks[k].text not in ("{", "}") and k < i + 40:
        if toks[k].text == "<":
            depth = 0
            while k < n:
                if toks[k].text == "<":
                    depth += 1
                elif toks[k].text == ">":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
        k += 1
    if k >= n or toks[k].text != "(":
        return
    end = _matching(toks, k, "(", ")")
    depth = 0
    prev_id = None
    at_param_start = True
    for j in range(k + 1, end):
        x = toks[j]
        if x.kind == "nl":
            continue
        if x.kind == "p" and x.text in "([{<":
            depth += 1
        elif x.kind == "p" and x.text in ")]}>":
            depth -= 1
        elif depth == 0 and x.text == ",":
            at_param_start = True
            prev_id = None
            continue
        if depth == 0 and at_param_start:
            if x.kind == "id":
                prev_id = x.text
            elif x.text == ":":
                if prev_id and prev_id != "_":
                    names.add(prev_id)
                at_param_start = False


def _collect_closure_params(toks, i, names):
    """`{ a, b in`, `{ (a: T, b) in`, `{ [weak self] a in`: the names between the '{' and 'in' on one line."""
    j = i - 1
    while j >= 0 and toks[j].kind != "nl" and i - j < 40:
        if toks[j].text == "{":
            break
        if toks[j].kind == "p" and toks[j].text not in ("(", ")", ",", ":", "[", "]", "<", ">", ".", "?", "->",
                                                         "!"):
            return
        j -= 1
    else:
        return
    if j < 0 or toks[j].text != "{":
        return
    for k in range(j + 1, i):
        x = toks[k]
        if x.kind == "id" and toks[k - 1].text in ("{", "(", ",", "]") and toks[k + 1].text in (",", ")", "in", ":"):
            names.add(x.text)


_IMPORT = re.compile(r"^[ \t]*(?:@[\w]+(?:\([^)\n]*\))?[ \t]+)*(?:(?:public|package|internal|fileprivate|private)"
                     r"[ \t]+)?import[ \t]+(?:(?:struct|class|enum|protocol|typealias|func|var|let|actor)[ \t]+)?"
                     r"([\w]+)", re.MULTILINE)
_EXPORTED_IMPORT = re.compile(r"@_exported[ \t]+(?:\w+[ \t]+)*import[ \t]+(?:\w+[ \t]+)?([\w]+)")


@dataclass
class Finding:
    path: str
    line: int
    col: int
    name: str
    modules: list
    member: bool
    needs: dict  # platform -> Version
    have: dict  # platform -> Version (the context's guarantee on the failing platforms)
    platforms: list  # failing platforms
    not_compiled: list = field(default_factory=list)  # platforms for which this code is excluded by #if


@dataclass
class _Scope:
    ctx: dict  # platform -> Version
    paren: int
    guard_pending: dict | None = None  # guard's else-block: on close, raise the parent's context by this
    else_ctx: dict | None = None  # `if #unavailable` body: its `else` gets this


@dataclass
class _Region:
    ctx: dict
    brace: int
    paren: int
    saw_keyword: bool = False


def _ctx_from(av: Availability, base: dict) -> dict:
    ctx = dict(base)
    for p in PLATFORMS:
        if "*" in av.unavailable or p in av.unavailable:
            ctx[p] = UNAVAILABLE
        elif p in av.introduced and av.introduced[p] > ctx[p]:
            ctx[p] = av.introduced[p]
    return ctx


def _max_ctx(a: dict, b: dict) -> dict:
    return {p: max(a[p], b[p]) for p in PLATFORMS}


def context_types(toks: list[Tok]) -> set:
    """Type names a file extends, declares or conforms to: `extension A.B: C, D where ... {`, `struct S: P {`.

    A member of a standard-library type or protocol can be used without a `.` only inside such a context (a nested
    type like `UTF8.ValidationError` is not visible as plain `ValidationError` elsewhere)."""
    names: set = set()
    n = len(toks)
    for i, t in enumerate(toks):
        if t.kind == "id" and t.text in ("extension", "struct", "class", "enum", "actor", "protocol") \
                and i + 1 < n and toks[i + 1].kind == "id" and toks[i + 1].text not in DECL_KEYWORDS:
            k = i + 1
            while k < n and toks[k].text not in ("{", "where", "}") and k < i + 80:
                if toks[k].kind == "id":
                    names.add(toks[k].text)
                k += 1
    return names


def scan_file(path: str, toks: list[Tok], table: dict, targets: dict, visible_modules: set,
              member_visible_modules: set) -> tuple[list[Finding], int]:
    """Findings in one file, and the number of table hits (guarded or not) that were checked."""
    in_context = context_types(toks)
    findings: list[Finding] = []
    hits = 0
    stack = [_Scope(dict(targets), 0)]
    brackets: list[str] = []  # open '(' / '[' (a scope remembers how many were open when it began)
    region: _Region | None = None
    cond: dict | None = None  # {'kind', 'brace', 'paren', 'av', 'unav'}
    pending_else: tuple | None = None  # (ctx, brace, paren)
    tracker = IfTracker()
    n = len(toks)
    i = 0
    while i < n:
        t = toks[i]
        kind = t.kind
        if kind == "nl":
            i += 1
            continue
        text = t.text
        brace = len(stack)
        paren = len(brackets)

        # --- #if / #elseif / #else / #endif -------------------------------------------------------------------
        if kind == "hash" and text in ("#if", "#elseif", "#else", "#endif"):
            j = i + 1
            while j < n and toks[j].kind != "nl":
                j += 1
            tracker.step(text, " ".join(x.text for x in toks[i + 1:j]))
            i = j
            continue

        # --- import lines: module names are not uses ---------------------------------------------------------
        if kind == "id" and text == "import" and (t.bol or (i > 0 and toks[i - 1].kind in ("at", "id"))):
            while i < n and toks[i].kind != "nl":
                i += 1
            continue

        # --- declaration regions opened by @available -------------------------------------------------------
        if region is not None and (brace < region.brace or (
                brace == region.brace and paren == region.paren and region.saw_keyword and t.bol
                and (kind == "at" or (kind == "id" and (text in DECL_KEYWORDS or text in MODIFIERS))))):
            region = None
        if kind == "at" and text == "@available":
            _, args, j = _read_attributes(toks, i)
            av = parse_availability_args(args)
            base = stack[-1].ctx if region is None or region.brace != brace else region.ctx
            region = _Region(_ctx_from(av, base), brace, paren)
            i = j
            continue
        if region is not None and kind == "id" and text in DECL_KEYWORDS and brace == region.brace \
                and paren == region.paren:
            region.saw_keyword = True

        # --- if / guard / while conditions ------------------------------------------------------------------
        if kind == "id" and text in ("if", "guard", "while") and not (i > 0 and toks[i - 1].text == "."):
            cond = {"kind": text, "brace": brace, "paren": paren, "av": None, "unav": None}
            if pending_else is not None and i > 0 and toks[i - 1].text == "else":
                pending_else = None  # `else if` after `if #unavailable`: not followed (see README)
        if kind == "hash" and text in ("#available", "#unavailable") and i + 1 < n and toks[i + 1].text == "(":
            end = _matching(toks, i + 1, "(", ")")
            av = parse_availability_args(toks[i + 2:end])
            if cond is not None and cond["brace"] == brace and cond["paren"] == paren:
                key = "av" if text == "#available" else "unav"
                if cond[key] is None:
                    cond[key] = Availability()
                cond[key].merge(av)
            i = end + 1
            continue

        # --- braces and parentheses ---------------------------------------------------------------------------
        if kind == "p":
            if text in "([":
                brackets.append(text)
            elif text in ")]":
                if len(brackets) > stack[-1].paren:
                    brackets.pop()
            elif text == "{":
                ctx = stack[-1].ctx
                if region is not None and region.brace == brace:
                    ctx = _max_ctx(ctx, region.ctx)  # the body, or a closure in the declaration's signature
                    if region.paren == paren:
                        region = None
                scope = _Scope(ctx, paren)
                if pending_else is not None and pending_else[1] == brace and pending_else[2] == paren \
                        and i > 0 and toks[i - 1].text == "else":
                    scope.ctx = _max_ctx(scope.ctx, pending_else[0])
                pending_else = None
                if cond is not None and cond["brace"] == brace and cond["paren"] == paren:
                    if cond["kind"] in ("if", "while"):
                        if cond["av"] is not None:
                            scope.ctx = _ctx_from(cond["av"], scope.ctx)
                        if cond["unav"] is not None and cond["kind"] == "if":
                            scope.else_ctx = _ctx_from(cond["unav"], stack[-1].ctx)
                    else:  # guard ... else {
                        if cond["av"] is not None:
                            scope.guard_pending = _ctx_from(cond["av"], stack[-1].ctx)
                        if cond["unav"] is not None:
                            scope.ctx = _ctx_from(cond["unav"], scope.ctx)
                    cond = None
                stack.append(scope)
            elif text == "}":
                if len(stack) > 1:
                    closed = stack.pop()
                    del brackets[closed.paren:]
                    paren = closed.paren
                    if closed.guard_pending is not None:
                        stack[-1].ctx = _max_ctx(stack[-1].ctx, closed.guard_pending)
                    if closed.else_ctx is not None:
                        pending_else = (closed.else_ctx, len(stack), paren)
                if cond is not None and cond["brace"] > len(stack):
                    cond = None
                if region is not None and region.brace > len(stack):
                    region = None
            i += 1
            continue

        # --- uses --------------------------------------------------------------------------------------------
        name = None
        if kind == "id":
            name = text
        elif kind in ("at", "hash"):
            name = text[1:]
        if name is not None and name in table:
            member = i > 0 and toks[i - 1].kind == "p" and toks[i - 1].text == "." and (
                toks[i - 1].line == t.line and toks[i - 1].col == t.col - 1)
            # An argument/parameter/tuple label (`f(name: x)`, `(name: T, ...)`) is not a use of `name`.
            is_label = (not member and kind == "id" and i + 1 < n and toks[i + 1].text == ":" and i > 0 and (
                (toks[i - 1].text in ("(", ",") and brackets and brackets[-1] == "(") or toks[i - 1].kind == "id"))
            entry = table[name]
            modules_ok = [m for m in entry.modules if m in IMPLICIT_MODULES or m in visible_modules
                          or (member and m in member_visible_modules)]
            reachable = member or entry.top_level or bool(entry.parents & in_context)
            if not is_label and modules_ok and reachable and any(tracker.active.values()):
                ctx = stack[-1].ctx
                if region is not None and region.brace == brace:
                    ctx = _max_ctx(ctx, region.ctx)
                hits += 1
                failing = [p for p in PLATFORMS if tracker.active[p] and entry.req[p] is not None
                           and entry.req[p] > ctx[p]]
                if failing:
                    findings.append(Finding(path, t.line, t.col, name, entry.modules, member,
                                            {p: entry.req[p] for p in PLATFORMS},
                                            {p: ctx[p] for p in failing}, failing,
                                            [p for p in PLATFORMS if not tracker.active[p]]))
        i += 1
    return findings, hits


def swift_files(root: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != ".build")
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".swift")]
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------------


def default_toolchain() -> str | None:
    swiftc = shutil.which("swiftc")
    if not swiftc:
        return None
    bin_dir = os.path.dirname(os.path.realpath(swiftc))
    return os.path.normpath(os.path.join(bin_dir, "..", ".."))


def run(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    started = time.monotonic()
    ap = argparse.ArgumentParser(description="Flag uses of standard-library APIs newer than the package's declared "
                                             "iOS/macOS minimum that no @available/#available guards.")
    ap.add_argument("paths", nargs="*", help="directories to scan, relative to --package (default: Sources, and "
                                             "Examples if present)")
    ap.add_argument("--package", default=".", help="package root (default: current directory)")
    ap.add_argument("--toolchain", help="toolchain root holding usr/lib/swift/linux (default: from `which swiftc`)")
    ap.add_argument("--ios", help="override the iOS minimum (e.g. 18 or 18.0)")
    ap.add_argument("--macos", help="override the macOS minimum (e.g. 15 or 15.0)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = ap.parse_args(argv)

    package = os.path.abspath(args.package)
    toolchain = args.toolchain or default_toolchain()
    if not toolchain:
        print("availability-check: no toolchain (pass --toolchain or put swiftc on PATH)", file=sys.stderr)
        return 2
    interfaces = find_interfaces(toolchain)
    if not interfaces:
        print(f"availability-check: no .swiftinterface files under {toolchain}/usr/lib/swift/linux", file=sys.stderr)
        return 2

    # Deployment targets.
    declared = {}
    member_import_visibility = False
    package_swift = os.path.join(package, "Package.swift")
    if os.path.isfile(package_swift):
        declared = read_platforms(package_swift)
        member_import_visibility = uses_member_import_visibility(package_swift)
    target_text = {}
    sources = {}
    for p in PLATFORMS:
        flag = getattr(args, p)
        if flag:
            target_text[p], sources[p] = flag, "flag"
        elif p in declared:
            target_text[p], sources[p] = declared[p], "Package.swift"
        else:
            target_text[p], sources[p] = SWIFTPM_DEFAULT[p], "SwiftPM default"
    targets = {}
    for p in PLATFORMS:
        v = parse_version(target_text[p])
        if v is None:
            print(f"availability-check: cannot read the {PLATFORM_LABEL[p]} version {target_text[p]!r}",
                  file=sys.stderr)
            return 2
        targets[p] = v
    if set(sources.values()) == {"Package.swift"}:
        declares = "Package.swift declares"
    elif set(sources.values()) == {"flag"}:
        declares = "--ios/--macos set"
    else:
        declares = "the deployment targets are"
    targets_phrase = " / ".join(f"{PLATFORM_LABEL[p]} {target_text[p]}" for p in PLATFORMS)

    # Sources.
    dirs = args.paths or [d for d in ("Sources", "Examples") if os.path.isdir(os.path.join(package, d))]
    files = []
    for d in dirs:
        full = d if os.path.isabs(d) else os.path.join(package, d)
        if os.path.isfile(full) and full.endswith(".swift"):
            files.append(full)
        elif os.path.isdir(full):
            files += swift_files(full)
        else:
            print(f"availability-check: no such directory: {full}", file=sys.stderr)
            return 2
    parsed = []
    own_names: set = set()
    exported: set = set()
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        code = strip_comments_and_strings(text)
        toks = tokenize(code)
        own_names |= project_declared_names(apple_compiled_tokens(toks))
        imports = set(_IMPORT.findall(code))
        exported |= set(_EXPORTED_IMPORT.findall(code))
        parsed.append((f, toks, imports))

    # The API table, restricted to names that need more than the declared minimum somewhere.
    full_table, names_indexed = build_table(interfaces)
    table = {name: e for name, e in full_table.items()
             if name not in own_names and any(e.req[p] is not None and e.req[p] > targets[p] for p in PLATFORMS)}

    # Imports per target: without MemberImportVisibility a member (`x.withLock`) is found through any file's import
    # in the same target; with it, only through the file's own imports.
    target_imports: dict = {}

    def target_key(path):
        rel = os.path.relpath(path, package).split(os.sep)
        return tuple(rel[:2]) if len(rel) > 2 else tuple(rel[:1])

    for f, _, imports in parsed:
        target_imports.setdefault(target_key(f), set()).update(imports)

    findings: list[Finding] = []
    hits = 0
    for f, toks, imports in parsed:
        member_modules = imports if member_import_visibility else target_imports[target_key(f)]
        fs, h = scan_file(f, toks, table, targets, imports | exported, member_modules | exported)
        findings += fs
        hits += h

    cwd = os.getcwd()

    def shown(path):
        rel = os.path.relpath(path, cwd)
        return path if rel.startswith("..") else rel

    def message(fd: Finding) -> str:
        needs = " / ".join(f"{PLATFORM_LABEL[p]} {vstr(fd.needs[p])}" for p in fd.platforms)
        raised = [p for p in fd.platforms if fd.have[p] != targets[p]]
        if raised:
            have = " / ".join(f"{PLATFORM_LABEL[p]} {vstr(fd.have[p])}" for p in fd.platforms)
            context = f"the enclosing @available/#available guarantees only {have} ({declares} {targets_phrase})"
        elif fd.platforms == list(PLATFORMS):
            context = f"{declares} {targets_phrase}"
        else:
            context = f"{declares} " + " / ".join(f"{PLATFORM_LABEL[p]} {target_text[p]}" for p in fd.platforms)
            others = [p for p in PLATFORMS if p not in fd.platforms and fd.needs[p] is not None
                      and fd.needs[p] > targets[p]]
            notes = [f"{PLATFORM_LABEL[p]} is " + ("not compiled here" if p in fd.not_compiled else "guarded")
                     for p in others]
            if notes:
                context += f" ({'; '.join(notes)})"
        return (f"'{fd.name}' ({', '.join(fd.modules)}) needs {needs}; {context} — guard it with "
                f"@available/#available or raise the platforms")

    elapsed = time.monotonic() - started
    api_names_used = sorted({fd.name for fd in findings})
    files_with = sorted({fd.path for fd in findings})
    if args.json:
        obj = {
            "ok": not findings,
            "deployment_targets": {PLATFORM_LABEL[p]: target_text[p] for p in PLATFORMS},
            "deployment_target_sources": {PLATFORM_LABEL[p]: sources[p] for p in PLATFORMS},
            "toolchain": toolchain,
            "member_import_visibility": member_import_visibility,
            "interface_files": [p for _, p in interfaces],
            "api_names_indexed": names_indexed,
            "api_names_in_table": len(table),
            "files_checked": len(files),
            "uses_checked": hits,
            "findings": [{
                "path": shown(fd.path), "line": fd.line, "column": fd.col, "name": fd.name, "modules": fd.modules,
                "member_use": fd.member,
                "needs": {PLATFORM_LABEL[p]: vstr(fd.needs[p]) if fd.needs[p] else None for p in PLATFORMS},
                "unguarded_platforms": [PLATFORM_LABEL[p] for p in fd.platforms],
                "context": {PLATFORM_LABEL[p]: vstr(fd.have[p], pad=False) for p in fd.platforms},
                "message": message(fd),
            } for fd in findings],
            "finding_count": len(findings),
            "elapsed_seconds": round(elapsed, 3),
        }
        json.dump(obj, out, indent=2)
        out.write("\n")
    else:
        for fd in findings:
            out.write(f"{shown(fd.path)}:{fd.line}:{fd.col}: error: {message(fd)}\n")
        if findings:
            out.write(f"availability-check: {len(findings)} unguarded use(s) of {len(api_names_used)} API name(s) "
                      f"({', '.join(api_names_used)}) in {len(files_with)} of {len(files)} files; {declares} "
                      f"{targets_phrase}; {hits} uses checked against {len(table)} API names newer than that "
                      f"({elapsed:.2f}s)\n")
        else:
            uses = f"{hits} use(s), all guarded," if hits else "no uses"
            out.write(f"availability-check: OK — {len(files)} files checked, {uses} of the {len(table)} API names "
                      f"newer than {targets_phrase} ({declares}); table from {len(interfaces)} interface files, "
                      f"{names_indexed} public names ({elapsed:.2f}s)\n")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(run())
