#!/usr/bin/env python3
"""Architecture check: the crate's modules import only downwards, and no two files need each other.

The layer order lives in one place: the fenced code block with info string `layers` in
ARCHITECTURE.md at the repository root. Each line of that block is one layer, lowest first; the
names on a line are top-level modules of `src/` (a folder `src/NAME/` or a file `src/NAME.rs`) and
may import each other. `src/bin/*.rs` is layer `bin`; `src/lib.rs` is the crate root and belongs
to no layer.

Every `src/**/*.rs` is read (comments and string literals skipped) and every path it uses is
resolved to the file that defines it: `use` declarations (brace trees, renames, globs) and paths in
code (`crate::a::b::f()`, `super::x::Y`, `self::z`, a child module's or an imported module's name;
`sptr::` in `src/bin/`). A path resolves to the longest prefix that is a module file, and a name that
file only re-exports (`pub use`, or a private `use` seen from a descendant) is followed to its
source file. `mod` declarations are not edges. A `pub use` is an edge for the layer rule (a facade
must not re-export from a higher layer) but not for the cycle rule (a facade is not a dependency
of the file holding it); importing a module's name alone (`use crate::a::b;`, `{self}`) is the
same: the paths written through that name are the real edges. Test code (`#[cfg(test)]` items,
and files declared under it) is held to the layers but makes no cycle: a test may borrow a
sibling's helper without tying the two files together.

Failures, each as `file:line: what is wrong and what to do`, exit status 1:
  * a src/ module that is in no layer;
  * an upward import: a file in layer i uses a file in layer j > i;
  * a file cycle: a strongly connected component of the file graph with more than one file.

Usage:
  python3 scripts/check_layers.py                 # check this repository (CI, scripts/test.sh)
  python3 scripts/check_layers.py --self-test     # the checker's own tests on temporary trees
  python3 scripts/check_layers.py --layers-from FILE --report [--edges]
      # another layers block (a Markdown file with a ```layers block, or the block's lines alone);
      # --report prints the findings but exits 0; --edges also prints every edge
  python3 scripts/check_layers.py --root DIR      # check another tree (DIR/src, DIR/ARCHITECTURE.md)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FIX_UNLISTED = "add it to the layers block of ARCHITECTURE.md"
FIX_UPWARD = "move the shared item down or the importing code up"
FIX_CYCLE = "break one edge: move what one file takes from the other into it, or into a new file both can import"

# --------------------------------------------------------------------------------------------
# The layers block


class LayerError(Exception):
    pass


def parse_layers(text: str, name: str) -> tuple[dict[str, int], list[list[str]], list[str]]:
    """Layer index per module name, the layers (names per line), and problems (`file:line: ...`).

    `text` is a Markdown file holding exactly one ```layers block, or (when it holds no fence at
    all) the block's lines alone."""
    lines = text.splitlines()
    starts = [i for i, l in enumerate(lines) if re.fullmatch(r"\s*(```|~~~)\s*layers\s*", l)]
    has_fence = any(re.match(r"\s*(```|~~~)", l) for l in lines)
    if not starts and has_fence:
        raise LayerError(f"{name}:1: no ```layers code block: add one listing the layers, lowest first")
    if len(starts) > 1:
        raise LayerError(
            f"{name}:{starts[1] + 1}: a second ```layers block: keep the layer order in one block"
        )
    if starts:
        first = starts[0] + 1
        fence = lines[starts[0]].strip()[:3]
        end = next((i for i in range(first, len(lines)) if lines[i].strip().startswith(fence)), None)
        if end is None:
            raise LayerError(f"{name}:{starts[0] + 1}: the ```layers block is not closed: close it")
        body = list(enumerate(lines[first:end], start=first + 1))
    else:
        body = list(enumerate(lines, start=1))
    index: dict[str, int] = {}
    layers: list[list[str]] = []
    problems: list[str] = []
    for lineno, raw in body:
        names = raw.split("#", 1)[0].split()
        if not names:
            continue
        for n in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n):
                problems.append(f"{name}:{lineno}: `{n}` is not a module name: fix the layers block")
            elif n in index:
                problems.append(
                    f"{name}:{lineno}: module {n} is in two layers: keep it on one line of the layers block"
                )
            else:
                index[n] = len(layers)
        layers.append(names)
    if not layers:
        raise LayerError(f"{name}:1: the layers block is empty: list the layers, lowest first")
    return index, layers, problems


# --------------------------------------------------------------------------------------------
# Rust source: comments and strings out, tokens in

# Where a comment or a literal may start: `//`, `/*`, a quote, or a prefixed string (b"", c"",
# r#""#, br"", cr"", b'') that is not the tail of an identifier.
LITERAL_START = re.compile(r"""//|/\*|"|'|(?<![A-Za-z0-9_])(?:[bc]?r#*"|b'|[bc]")""")
PLAIN_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
BLOCK_COMMENT = re.compile(r"/\*|\*/")
ESCAPED_CHAR = re.compile(r"'\\(?:[^'\\]|\\.)*'", re.S)


def strip_rust(src: str) -> str:
    """The source with comments and string/char literals blanked (newlines kept, same length)."""
    n = len(src)
    pieces: list[str] = []
    done = 0  # src[:done] is in pieces

    def blank(a: int, b: int) -> None:
        nonlocal done
        b = min(b, n)
        pieces.append(src[done:a])
        pieces.append(re.sub(r"[^\n]", " ", src[a:b]))
        done = b

    i = 0
    while True:
        m = LITERAL_START.search(src, i)
        if m is None:
            break
        i, tok = m.start(), m.group(0)
        if tok == "//":
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif tok == "/*":  # block comments nest
            depth, j = 1, i + 2
            while depth:
                c = BLOCK_COMMENT.search(src, j)
                if c is None:
                    j = n
                    break
                depth += 1 if c.group(0) == "/*" else -1
                j = c.end()
            blank(i, j)
            i = j
        elif tok.endswith('"') and "r" in tok:  # raw string: no escapes
            close = '"' + tok[tok.index("r") + 1 : -1]
            j = src.find(close, m.end())
            j = n if j < 0 else j + len(close)
            blank(i, j)
            i = j
        elif tok.endswith('"'):
            q = m.end() - 1
            s = PLAIN_STRING.match(src, q)
            j = n if s is None else s.end()
            blank(i, j)
            i = j
        else:  # ' or b': a char literal, or a lifetime / label
            q = m.end() - 1
            e = ESCAPED_CHAR.match(src, q)
            if e is not None:
                blank(i, e.end())
                i = e.end()
            elif q + 2 < n and src[q + 2] == "'" and src[q + 1] != "\n":  # 'x'
                blank(i, q + 3)
                i = q + 3
            else:
                i = q + 1
    pieces.append(src[done:])
    return "".join(pieces)


TOKEN = re.compile(r"r#[A-Za-z_][A-Za-z0-9_]*|\$crate|[A-Za-z_][A-Za-z0-9_]*|\d[A-Za-z0-9_]*|::|\S")


class Tok:
    __slots__ = ("text", "line", "ident")

    def __init__(self, text: str, line: int, ident: bool):
        self.text = text
        self.line = line
        self.ident = ident  # an identifier or keyword (or $crate)


def tokenize(clean: str) -> list[Tok]:
    toks = []
    for line, text in enumerate(clean.split("\n"), start=1):
        for t in TOKEN.findall(text):
            c = t[0]
            ident = c.isalpha() or c == "_" or c == "$"
            if ident and t.startswith("r#"):
                t = t[2:]
            toks.append(Tok(t, line, ident))
    return toks


# --------------------------------------------------------------------------------------------
# One file: its module path, `mod` items, `use` leaves and paths in code

Scope = tuple  # names of the inline modules (`mod tests { .. }`) around a token, outermost first


@dataclass
class UseLeaf:
    scope: Scope
    segs: tuple  # as written; may start with crate/self/super/a child's or an import's name
    kind: str  # "name" (an item or module), "self" (`{self}`), "glob"
    alias: str | None  # the name it binds (None for a glob or `as _`)
    pub: bool
    line: int
    test: bool  # under #[cfg(test)]


@dataclass
class SrcFile:
    rel: str  # "src/a/b.rs"
    module: tuple  # ("a", "b"); ("bin", "x") for src/bin/x.rs; () for src/lib.rs
    crate_root: tuple  # () in the library, ("bin", "x") in a binary
    is_bin: bool
    child_mods: dict = field(default_factory=dict)  # scope -> {name} declared `mod name;`
    inline_mods: dict = field(default_factory=dict)  # scope -> {name} declared `mod name { .. }`
    uses: list = field(default_factory=list)  # [UseLeaf]
    imports: dict = field(default_factory=dict)  # scope -> {alias: UseLeaf}
    globs: dict = field(default_factory=dict)  # scope -> [UseLeaf]
    paths: list = field(default_factory=list)  # [(scope, segs, line, test)] written in code
    test_children: set = field(default_factory=set)  # module paths declared `#[cfg(test)] mod x;`
    test: bool = False  # the whole file is test code (`#![cfg(test)]`, or declared under it)
    defines: set = field(default_factory=set)  # item names this file defines (any scope)


ITEM_DEF = re.compile(
    r"\b(?:fn|struct|enum|trait|type|const|static|union|mod)\s+(?:r#)?([A-Za-z_][A-Za-z0-9_]*)"
    r"|\bmacro_rules!\s*([A-Za-z_][A-Za-z0-9_]*)"
)


def module_of(rel_to_src: Path) -> tuple[tuple, tuple, bool] | None:
    """(module path, crate root, is a binary) of a file, from its path under src/."""
    parts = list(rel_to_src.parts)
    if not parts or not parts[-1].endswith(".rs"):
        return None
    stem = parts[-1][:-3]
    if parts[0] == "bin":
        if len(parts) == 2:
            return ("bin", stem), ("bin", stem), True
        root = ("bin", parts[1])
        inner = parts[2:-1] + ([] if stem in ("main", "mod") else [stem])
        return root + tuple(inner), root, True
    if len(parts) == 1 and stem in ("lib", "main"):
        return (), (), False
    mod = parts[:-1] + ([] if stem == "mod" else [stem])
    return tuple(mod), (), False


def parse_use_tree(toks: list[Tok], i: int, prefix: tuple, out: list) -> int:
    """Parses one use tree from toks[i]; appends (segs, kind, alias, line); returns the next index."""
    segs = list(prefix)
    line = toks[i].line if i < len(toks) else 0
    if i < len(toks) and toks[i].text == "::":  # `use ::x` (an extern crate) or `{::x}`
        segs.append("")
        i += 1
    while i < len(toks):
        t = toks[i]
        if t.text == "{":
            i += 1
            while i < len(toks) and toks[i].text != "}":
                i = parse_use_tree(toks, i, tuple(segs), out)
                if i < len(toks) and toks[i].text == ",":
                    i += 1
            return i + 1
        if t.text == "*":
            out.append((tuple(segs), "glob", None, t.line))
            return i + 1
        if t.ident:
            segs.append(t.text)
            line = t.line
            i += 1
            if i < len(toks) and toks[i].text == "::":
                i += 1
                continue
            alias = segs[-1]
            kind = "name"
            if segs[-1] == "self" and len(segs) > 1:
                segs.pop()
                kind = "self"
                alias = segs[-1] if segs else None
            if i + 1 < len(toks) and toks[i].text == "as":
                alias = None if toks[i + 1].text == "_" else toks[i + 1].text
                i += 2
            out.append((tuple(segs), kind, alias, line))
            return i
        return i + 1  # something unexpected: skip it
    return i


def cfg_test_attribute(toks: list[Tok], i: int) -> tuple[int, bool, bool] | None:
    """At `#[..]` or `#![..]`: (index after it, whether it is a cfg that needs `test`, inner)."""
    j = i + 1
    inner = j < len(toks) and toks[j].text == "!"
    if inner:
        j += 1
    if j >= len(toks) or toks[j].text != "[":
        return None
    depth, k = 0, j
    while k < len(toks):
        depth += {"[": 1, "]": -1}.get(toks[k].text, 0)
        if depth == 0:
            break
        k += 1
    words = [t.text for t in toks[j + 1 : k]]
    is_test = bool(words) and words[0] == "cfg" and "test" in words and "not" not in words
    return k + 1, is_test, inner


def parse_file(path: Path, rel: str, module: tuple, crate_root: tuple, is_bin: bool) -> SrcFile:
    src = path.read_text(encoding="utf-8", errors="replace")
    clean = strip_rust(src)
    f = SrcFile(rel, module, crate_root, is_bin)
    f.defines = {a or b for a, b in ITEM_DEF.findall(clean)}
    toks = tokenize(clean)
    stack: list = []  # per open `{`: (the inline module's name or None, test code)
    scope: list[str] = []
    parens = 0  # depth of ( and [
    pending_test: int | None = None  # a #[cfg(test)] waits for its item, at this paren depth
    i = 0
    n = len(toks)

    def in_test() -> bool:
        return f.test or pending_test is not None or any(t for _, t in stack)

    while i < n:
        t = toks[i].text
        if t == "#":
            got = cfg_test_attribute(toks, i)
            if got is not None and got[1]:  # other attributes are read like code
                i, _, inner = got
                if inner and not stack:
                    f.test = True
                else:
                    pending_test = parens
                continue
        if t in "([":
            parens += 1
        elif t in ")]":
            parens -= 1
        elif t == ";" and pending_test == parens:
            pending_test = None
        if t == "{":
            name = None
            if i >= 2 and toks[i - 2].text == "mod" and toks[i - 1].ident:
                name = toks[i - 1].text
                f.inline_mods.setdefault(tuple(scope), set()).add(name)
                scope.append(name)
            stack.append((name, pending_test is not None))
            pending_test = None
            i += 1
            continue
        if t == "}":
            if stack and stack.pop()[0] is not None:
                scope.pop()
            i += 1
            continue
        if t == "mod" and i + 2 < n and toks[i + 1].ident and toks[i + 2].text == ";":
            f.child_mods.setdefault(tuple(scope), set()).add(toks[i + 1].text)
            if in_test():
                f.test_children.add(module + tuple(scope) + (toks[i + 1].text,))
            pending_test = None
            i += 3
            continue
        if t == "use" and i + 1 < n and toks[i + 1].text != "<" and (i == 0 or toks[i - 1].text != "::"):
            pub = False
            if i > 0 and toks[i - 1].text == "pub":
                pub = True
            elif i > 0 and toks[i - 1].text == ")":
                k, depth = i - 1, 0
                while k >= 0:
                    depth += {")": 1, "(": -1}.get(toks[k].text, 0)
                    if depth == 0:
                        break
                    k -= 1
                pub = k > 0 and toks[k - 1].text == "pub" and toks[k + 1].text != "self"
            leaves: list = []
            j = i + 1
            while j < n and toks[j].text != ";":
                before = j
                j = parse_use_tree(toks, j, (), leaves)
                if j == before:
                    j += 1
            sc = tuple(scope)
            for segs, kind, alias, line in leaves:
                leaf = UseLeaf(sc, segs, kind, alias, pub, line, in_test())
                f.uses.append(leaf)
                if kind == "glob":
                    f.globs.setdefault(sc, []).append(leaf)
                elif alias:
                    f.imports.setdefault(sc, {})[alias] = leaf
            pending_test = None
            i = j + 1
            continue
        if toks[i].ident and i + 2 < n and toks[i + 1].text == "::" and toks[i + 2].ident:
            if i == 0 or toks[i - 1].text != "::":
                segs = [t]
                j = i
                while j + 2 < n and toks[j + 1].text == "::" and toks[j + 2].ident:
                    segs.append(toks[j + 2].text)
                    j += 2
                f.paths.append((tuple(scope), tuple(segs), toks[i].line, in_test()))
        i += 1
    return f


# --------------------------------------------------------------------------------------------
# The tree: resolving paths to files


@dataclass
class Edge:
    src: SrcFile
    dst: SrcFile
    line: int
    shown: str  # the path as resolved from the crate root, e.g. crate::a::b::C
    cycle: bool  # counts for the cycle rule (False: a `pub use` facade, a module-name import, test code)
    how: str  # "use", "pub use", "path"
    test: bool  # written in test code (#[cfg(test)])


class Tree:
    def __init__(self, root: Path):
        self.root = root
        self.files: list[SrcFile] = []
        self.by_module: dict[tuple, SrcFile] = {}
        src = root / "src"
        for p in sorted(src.rglob("*.rs")):
            if not p.is_file():
                continue
            r = p.relative_to(src)
            m = module_of(r)
            if m is None:
                continue
            module, crate_root, is_bin = m
            f = parse_file(p, str(Path("src") / r), module, crate_root, is_bin)
            self.files.append(f)
            # `src/a/b.rs` and `src/a/b/mod.rs` both: keep the first (sorted) and let rustc complain
            self.by_module.setdefault(module, f)
        # files declared `#[cfg(test)] mod x;` (and their children) are test code
        tests = {m for f in self.files for m in f.test_children}
        for f in self.files:
            if any(f.module[: len(m)] == m for m in tests):
                f.test = True

    # -- names ------------------------------------------------------------------------------

    def locate(self, module: tuple) -> tuple[SrcFile, tuple] | None:
        """The file and inline scope of a module path, if it is a module."""
        for k in range(len(module), -1, -1):
            f = self.by_module.get(module[:k])
            if f is not None:
                rest = module[k:]
                sc: tuple = ()
                for name in rest:
                    if name not in f.inline_mods.get(sc, ()):
                        return None
                    sc = sc + (name,)
                return f, sc
        return None

    def lookup(self, f: SrcFile, scope: tuple, name: str, seen: frozenset) -> tuple | None:
        """The absolute path a bare name stands for in a scope of a file, if it is crate-local."""
        here = f.module + scope
        if name in f.child_mods.get(scope, ()) or name in f.inline_mods.get(scope, ()):
            return here + (name,)
        if not scope and here + (name,) in self.by_module:  # a child file, declared or not
            return here + (name,)
        leaf = f.imports.get(scope, {}).get(name)
        if leaf is not None:
            return self.absolute(f, leaf.scope, leaf.segs, seen)
        for g in f.globs.get(scope, []):
            key = ("glob", f.rel, g.line, name)
            if key in seen:
                continue
            base = self.absolute(f, g.scope, g.segs, seen | {key})
            if base is None:
                continue
            loc = self.locate(base)
            if loc is None:
                continue
            gf, gsc = loc
            if name in gf.defines:
                return base + (name,)
            found = self.lookup(gf, gsc, name, seen | {key})
            if found is not None:
                return found
        return None

    def absolute(self, f: SrcFile, scope: tuple, segs: tuple, seen: frozenset = frozenset()) -> tuple | None:
        """A path written in a scope of a file, from the crate root; None if not crate-local."""
        if not segs:
            return None
        first, rest = segs[0], segs[1:]
        if first in ("crate", "$crate"):
            return f.crate_root + rest
        if first == "sptr" and f.is_bin:
            return rest
        here = f.module + scope
        if first == "self":
            return here + rest
        if first == "super":
            k = 0
            while k < len(segs) and segs[k] == "super":
                k += 1
            if k > len(here) - len(f.crate_root):
                return None
            return here[: len(here) - k] + segs[k:]
        if first == "" or first in ("std", "core", "alloc"):
            return None
        key = ("name", f.rel, scope, first)
        if key in seen:
            return None
        base = self.lookup(f, scope, first, seen | {key})
        return None if base is None else base + rest

    def resolve(self, path: tuple, asker: tuple, seen: frozenset = frozenset()) -> tuple[SrcFile, bool] | None:
        """The file defining what a crate-root path names, and whether it names a module."""
        for k in range(len(path), -1, -1):
            f = self.by_module.get(path[:k])
            if f is not None:
                break
        else:
            return None
        rest = path[k:]
        if not rest:
            return f, True
        name = rest[0]
        key = (f.rel, name)
        if key in seen:
            return f, False
        seen = seen | {key}
        # a private import is seen from the module holding it and its descendants (same crate)
        sees_private = asker[: len(f.module)] == f.module and (f.is_bin or asker[:1] != ("bin",))
        leaf = f.imports.get((), {}).get(name)
        if leaf is not None and (leaf.pub or sees_private) and name not in f.inline_mods.get((), ()):
            src = self.absolute(f, (), leaf.segs)
            if src is None:  # re-exported from another crate: this file is where it comes from
                return f, False
            return self.resolve(src + rest[1:], asker, seen)
        if name in f.inline_mods.get((), ()) or name in f.defines:
            return f, False
        for g in f.globs.get((), []):
            if not (g.pub or sees_private):
                continue
            base = self.absolute(f, (), g.segs)
            loc = self.locate(base) if base is not None else None
            if loc is None:
                continue
            gf, gsc = loc
            if name in gf.defines or name in gf.imports.get(gsc, {}) or (gf.module + gsc + (name,)) in self.by_module:
                return self.resolve(base + rest, asker, seen)
        return f, False

    # -- edges ------------------------------------------------------------------------------

    def edges(self) -> list[Edge]:
        """Every use of another file, one per path written (a file's uses of itself left out)."""
        out: list[Edge] = []
        for f in self.files:
            for leaf in f.uses:
                path = self.absolute(f, leaf.scope, leaf.segs)
                if path is None:
                    continue
                got = self.resolve(path, f.module + leaf.scope)
                if got is None:
                    continue
                dst, is_module = got
                if dst is f:
                    continue
                namespace = leaf.kind == "self" or (leaf.kind == "name" and is_module)
                test = leaf.test or f.test
                out.append(
                    Edge(f, dst, leaf.line, show(path, leaf.kind, f),
                         cycle=not leaf.pub and not namespace and not test,
                         how="pub use" if leaf.pub else "use", test=test)
                )
            for scope, segs, line, test in f.paths:
                if segs[0] not in ("crate", "$crate", "self", "super") and not (segs[0] == "sptr" and f.is_bin):
                    # a bare name: only a child module or an imported name makes it crate-local
                    if self.absolute(f, scope, segs[:1]) is None:
                        continue
                path = self.absolute(f, scope, segs)
                if path is None:
                    continue
                got = self.resolve(path, f.module + scope)
                if got is None:
                    continue
                dst, is_module = got
                if dst is f:
                    continue
                test = test or f.test
                out.append(Edge(f, dst, line, show(path, "name", f), cycle=not is_module and not test,
                                how="path", test=test))
        return out


def show(path: tuple, kind: str, f: SrcFile) -> str:
    if f.is_bin and path[: len(f.crate_root)] != f.crate_root:
        s = "::".join(("sptr",) + path)
    else:
        s = "::".join(("crate",) + path[len(f.crate_root):])
    return s + ("::*" if kind == "glob" else "")


# --------------------------------------------------------------------------------------------
# The rules


def layer_of(f: SrcFile) -> str | None:
    if f.is_bin:
        return "bin"
    return f.module[0] if f.module else None  # src/lib.rs: the crate root, in no layer


def tarjan(nodes: list, succ: dict) -> list[list]:
    index: dict = {}
    low: dict = {}
    on: set = set()
    stack: list = []
    comps: list = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
    return comps


@dataclass
class Result:
    problems: list  # [(sort key, message)]
    files: int
    edges: list
    layers: int
    cycles: list  # [[rel, ...]]
    upward: int
    unlisted: list
    missing: list  # block names with no module (yet)


def check(root: Path, layers_text: str, layers_name: str) -> Result:
    index, layers, block_problems = parse_layers(layers_text, layers_name)
    tree = Tree(root)
    problems: list = [((layers_name, 0), p) for p in block_problems]

    # every top-level module in a layer
    tops: dict[str, SrcFile] = {}
    for f in tree.files:
        top = layer_of(f)
        if top is None:
            continue
        cur = tops.get(top)
        if cur is None or len(f.module) < len(cur.module) or (f.module == cur.module and f.rel < cur.rel):
            tops[top] = f
    unlisted = sorted(t for t in tops if t not in index)
    for t in unlisted:
        f = tops[t]
        problems.append(((f.rel, 1), f"{f.rel}:1: module {t} is in no layer: {FIX_UNLISTED}"))
    missing = sorted(n for n in index if n not in tops)

    edges = tree.edges()

    # upward imports: one finding per (file, target file), at its first line
    seen: dict = {}
    for e in sorted(edges, key=lambda e: (e.src.rel, e.line)):
        a, b = layer_of(e.src), layer_of(e.dst)
        if a is None or b is None or a not in index or b not in index or index[b] <= index[a]:
            continue
        k = (e.src.rel, e.dst.rel)
        if k in seen:
            seen[k][1] += 1
            continue
        seen[k] = [e, 0]
    upward = 0
    for (srel, drel), (e, more) in seen.items():
        upward += 1
        what = "re-exports" if e.how == "pub use" else "imports"
        extra = f" (and {more} more line{'s' if more > 1 else ''})" if more else ""
        problems.append(((srel, e.line), (
            f"{srel}:{e.line}: {what} {e.shown} ({drel}, layer {layer_of(e.dst)}) from layer "
            f"{layer_of(e.src)}{extra}: {FIX_UPWARD}"
        )))

    # file cycles
    succ: dict = {}
    first_edge: dict = {}
    for e in sorted(edges, key=lambda e: (e.src.rel, e.line)):
        if not e.cycle or e.src is e.dst:
            continue
        succ.setdefault(e.src.rel, set()).add(e.dst.rel)
        first_edge.setdefault((e.src.rel, e.dst.rel), e)
    nodes = sorted({f.rel for f in tree.files})
    succ = {k: sorted(v) for k, v in succ.items()}
    cycles = []
    for comp in tarjan(nodes, succ):
        if len(comp) < 2:
            continue
        comp = sorted(comp)
        cycles.append(comp)
        members = set(comp)
        pairs = sorted((first_edge[(a, b)] for a in comp for b in succ.get(a, ()) if b in members),
                       key=lambda e: (e.src.rel, e.line, e.dst.rel))
        head = pairs[0]
        lines = [
            f"{head.src.rel}:{head.line}: file cycle among {len(comp)} files ({', '.join(comp)}): "
            f"{FIX_CYCLE}; one edge per pair:"
        ]
        for e in pairs:
            lines.append(f"    {e.src.rel}:{e.line}: uses {e.shown} -> {e.dst.rel}")
        problems.append(((head.src.rel, head.line), "\n".join(lines)))

    problems.sort(key=lambda p: p[0])
    return Result(problems, len(tree.files), edges, len(layers), cycles, upward, unlisted, missing)


# --------------------------------------------------------------------------------------------
# Self-test on temporary trees

BLOCK = "# Architecture\n\nLayers, lowest first.\n\n```layers\n# lowest first\nlow\nmid side\ntop\nbin\n```\n"


def make_tree(base: Path, files: dict[str, str], block: str = BLOCK) -> Path:
    for rel, text in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (base / "ARCHITECTURE.md").write_text(block)
    return base


def run_tree(files: dict[str, str], block: str = BLOCK) -> Result:
    with tempfile.TemporaryDirectory(prefix="check_layers_") as d:
        root = make_tree(Path(d), files, block)
        return check(root, block, "ARCHITECTURE.md")


def run_main(files: dict[str, str], block: str = BLOCK) -> tuple[int, str]:
    """The command line on a temporary tree: (exit status, what it printed)."""
    with tempfile.TemporaryDirectory(prefix="check_layers_") as d:
        root = make_tree(Path(d), files, block)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["--root", str(root)])
        return rc, buf.getvalue()


CLEAN = {
    "src/lib.rs": "pub mod low;\npub mod mid;\npub mod side;\npub mod top;\npub use low::Thing;\n",
    "src/low/mod.rs": "mod inner;\npub use inner::Thing;\n\npub struct Err;\n",
    "src/low/inner.rs": "use super::Err;\n\npub struct Thing(pub Option<Err>);\n",
    "src/mid.rs": (
        "//! Mid layer. Never `use crate::top::Top;` here.\n"
        "use crate::low::Thing;\n"
        "pub fn f() -> Thing { let _s = \"crate::top::Top\"; /* crate::top::Top */ Thing(None) }\n"
    ),
    "src/side.rs": "use crate::low::*;\npub fn g() -> u8 { crate::mid::f(); 1 }\n",
    "src/top.rs": "use crate::{low::Thing, mid::{self, f}};\npub struct Top;\npub fn h() -> Thing { mid::f(); f() }\n",
    "src/bin/tool.rs": "use sptr::top::Top;\nfn main() { let _ = sptr::side::g(); }\n",
}


def edge_set(res: Result) -> set:
    return {(e.src.rel, e.dst.rel) for e in res.edges}


def self_test() -> int:
    failures: list[str] = []

    def expect(cond: bool, what: str, res: Result | None = None) -> None:
        if not cond:
            detail = ""
            if res is not None:
                detail = "\n      " + "\n      ".join(p for _, p in res.problems) if res.problems else " (no problems)"
                detail += "\n      edges: " + ", ".join(sorted(f"{a}->{b}" for a, b in edge_set(res)))
            failures.append(what + detail)

    # a clean tree passes
    res = run_tree(CLEAN)
    expect(not res.problems, "a clean tree passes", res)
    es = edge_set(res)
    # the re-export through low/mod.rs is followed to low/inner.rs ...
    expect(("src/mid.rs", "src/low/inner.rs") in es, "crate::low::Thing resolves to src/low/inner.rs", res)
    expect(("src/mid.rs", "src/low/mod.rs") not in es, "crate::low::Thing is no edge to the facade", res)
    # ... and the facade plus `use super::Err` from the child is not a cycle
    expect(("src/low/inner.rs", "src/low/mod.rs") in es, "use super::Err is an edge to low/mod.rs", res)
    expect(not res.cycles, "a mod.rs facade and its child's use super::Err are no cycle", res)
    # lib.rs re-exports are followed too
    # brace trees are flattened: crate::{low::Thing, mid::{self, f}}
    top = [e for e in res.edges if e.src.rel == "src/top.rs"]
    shown = {e.shown for e in top}
    expect({"crate::low::Thing", "crate::mid", "crate::mid::f"} <= shown,
           f"use crate::{{low::Thing, mid::{{self, f}}}} is flattened (got {sorted(shown)})", res)
    expect(any(e.dst.rel == "src/mid.rs" and e.how == "path" for e in top),
           "mid::f() through the imported module name is an edge", res)
    expect(any(e.src.rel == "src/side.rs" and e.dst.rel == "src/low/mod.rs" and e.shown == "crate::low::*"
               for e in res.edges), "a glob import is an edge to its module's file", res)
    # comments and strings do not count
    expect(not any(e.dst.rel == "src/top.rs" for e in res.edges if e.src.rel == "src/mid.rs"),
           "imports in comments and strings are ignored", res)
    # binaries: sptr:: is the crate
    expect(("src/bin/tool.rs", "src/top.rs") in es and ("src/bin/tool.rs", "src/side.rs") in es,
           "sptr:: paths in src/bin/ are the crate", res)

    # the brace tree of the brief, with nested self, resolved from a sibling
    res = run_tree({
        "src/lib.rs": "pub mod a;\npub mod b;\npub mod top;\n",
        "src/a.rs": "pub struct X;\n",
        "src/b/mod.rs": "pub mod c;\npub fn g() {}\n",
        "src/b/c.rs": "pub struct Y;\n",
        "src/top.rs": "use crate::{a::X,\n    b::{c::Y, self}};\nfn f(_: X, _: Y) { b::g() }\n",
    }, "```layers\na b\ntop\n```\n")
    es = edge_set(res)
    expect(not res.problems, "a::X + b::{c::Y, self} tree passes", res)
    expect({("src/top.rs", "src/a.rs"), ("src/top.rs", "src/b/c.rs"), ("src/top.rs", "src/b/mod.rs")} <= es,
           "use crate::{a::X, b::{c::Y, self}} gives edges to a.rs, b/c.rs and b/mod.rs", res)
    lines = {e.dst.rel: e.line for e in res.edges if e.src.rel == "src/top.rs" and e.how == "use"}
    expect(lines.get("src/b/c.rs") == 2, f"a multi-line use reports the leaf's line (got {lines})", res)

    # an upward import fails and names the file and both layers
    bad = dict(CLEAN)
    bad["src/low/inner.rs"] = "use super::Err;\n\n\nuse crate::top::Top;\npub struct Thing(pub Option<Err>);\n"
    res = run_tree(bad)
    msgs = [p for _, p in res.problems]
    expect(res.upward == 1 and any(
        m.startswith("src/low/inner.rs:4: imports crate::top::Top (src/top.rs, layer top) from layer low")
        for m in msgs), "an upward import fails, naming the file, line and both layers", res)

    # an upward re-export from a facade fails too
    bad = dict(CLEAN)
    bad["src/low/mod.rs"] = "mod inner;\npub use inner::Thing;\npub use crate::top::Top;\npub struct Err;\n"
    res = run_tree(bad)
    expect(any(p.startswith("src/low/mod.rs:3: re-exports crate::top::Top") for _, p in res.problems),
           "a facade re-exporting from a higher layer fails", res)

    # a two-file cycle fails (super:: inline paths count; mod declarations do not)
    cyc = dict(CLEAN)
    cyc["src/mid.rs"] = "pub mod a;\npub mod b;\n"
    cyc["src/mid/a.rs"] = "use super::b::B;\npub struct A;\npub fn fa(_: B) {}\n"
    cyc["src/mid/b.rs"] = "pub struct B;\npub fn fb() -> super::a::A { super::a::A }\n"
    cyc["src/side.rs"] = "pub fn g() {}\n"
    res = run_tree(cyc)
    expect(res.cycles == [["src/mid/a.rs", "src/mid/b.rs"]], f"a two-file cycle fails (got {res.cycles})", res)
    expect(any("file cycle among 2 files" in p and "src/mid/a.rs:1: uses crate::mid::b::B -> src/mid/b.rs" in p
               and "src/mid/b.rs:2: uses crate::mid::a::A -> src/mid/a.rs" in p for _, p in res.problems),
           "the cycle message lists both files and one edge per pair", res)

    # `use super::*` in an inline `mod tests` is the file itself, not the parent
    t = dict(CLEAN)
    t["src/low/inner.rs"] = CLEAN["src/low/inner.rs"] + "#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { let _ = Err; }\n}\n"
    t["src/low/mod.rs"] = "mod inner;\npub use inner::Thing;\npub struct Err;\nfn k() -> Thing { inner::Thing(None) }\n"
    res = run_tree(t)
    expect(("src/low/mod.rs", "src/low/inner.rs") in edge_set(res), "a child module's name in code is an edge", res)
    expect(len(res.cycles) == 1, "a parent using its child's items and the child using super:: is a cycle", res)

    # test code: no cycle edge, but still bound by the layers
    t = dict(CLEAN)
    t["src/mid.rs"] = "pub mod a;\npub mod b;\n"
    t["src/mid/a.rs"] = "use super::b::B;\npub struct A;\npub fn fa(_: B) {}\n"
    t["src/mid/b.rs"] = (
        "pub struct B;\n#[cfg(test)]\nmod tests {\n    use super::super::a::A;\n    use crate::low::Thing;\n}\n"
        "#[cfg(test)]\nfn helper() -> [u8; 2] { let _ = crate::mid::a::fa; [0; 2] }\n"
        "#[cfg(test)]\nuse crate::top::Top;\n#[cfg(test)]\nmod more;\n"
    )
    t["src/mid/b/more.rs"] = "use crate::mid::a::A;\n"
    t["src/side.rs"] = "pub fn g() {}\n"
    res = run_tree(t)
    tests = {(e.src.rel, e.dst.rel, e.line) for e in res.edges if e.test}
    expect({("src/mid/b.rs", "src/mid/a.rs", 4), ("src/mid/b.rs", "src/low/inner.rs", 5),
            ("src/mid/b.rs", "src/mid/a.rs", 8), ("src/mid/b.rs", "src/top.rs", 10),
            ("src/mid/b/more.rs", "src/mid/a.rs", 1)} == tests,
           f"edges under #[cfg(test)] are marked as test code (got {sorted(tests)})", res)
    expect(not res.cycles, "test code makes no file cycle", res)
    expect(res.upward == 1 and any(p.startswith("src/mid/b.rs:10: imports crate::top::Top") for _, p in res.problems),
           "an upward import in test code still fails", res)

    # lib.rs re-exports are followed; a child sees its parent's private imports through super::
    res = run_tree({
        "src/lib.rs": "pub mod low;\npub mod mid;\npub use low::Thing;\n",
        "src/low/mod.rs": "mod inner;\npub use inner::Thing;\n",
        "src/low/inner.rs": "pub struct Thing;\n",
        "src/mid/mod.rs": "mod kid;\nuse crate::Thing;\nfn f(_: Thing) {}\n",
        "src/mid/kid.rs": "use super::Thing;\nfn g() { let _ = super::super::super::Nothing; }\n",
    }, "```layers\nlow\nmid\n```\n")
    es = edge_set(res)
    expect({("src/mid/mod.rs", "src/low/inner.rs"), ("src/mid/kid.rs", "src/low/inner.rs")} <= es
           and not any(b in ("src/lib.rs", "src/low/mod.rs") for _, b in es),
           "crate::Thing (lib.rs -> low/mod.rs -> low/inner.rs) and super::Thing are followed", res)
    expect(not res.problems, "a tree with re-exports at two levels passes", res)

    # an unlisted module fails
    un = dict(CLEAN)
    un["src/extra/mod.rs"] = "pub fn e() {}\n"
    res = run_tree(un)
    expect(res.unlisted == ["extra"] and any(
        p == f"src/extra/mod.rs:1: module extra is in no layer: {FIX_UNLISTED}" for _, p in res.problems),
        "an unlisted module fails", res)

    # the command line: one summary line on success; `file:line: ...` and exit 1 on failure
    rc, out = run_main(CLEAN)
    expect(rc == 0 and out.count("\n") == 1 and out.startswith("check_layers: OK: 7 files read"),
           f"a clean tree: exit 0 and one summary line (got {rc}: {out!r})")
    rc, out = run_main(un)
    expect(rc == 1 and out.splitlines()[0] == f"src/extra/mod.rs:1: module extra is in no layer: {FIX_UNLISTED}",
           f"a failing tree: exit 1, file:line: first (got {rc}: {out!r})")
    rc, out = run_main(CLEAN, "# no block\n\n```rust\n```\n")
    expect(rc == 1 and out.startswith("ARCHITECTURE.md:1: no ```layers code block"),
           f"no layers block: exit 1 (got {rc}: {out!r})")

    # the layers block: exactly one, names once
    try:
        parse_layers("# A\n\nno block here\n```rust\nfn x() {}\n```\n", "A.md")
        expect(False, "a file with no layers block is an error")
    except LayerError:
        pass
    index, _, _ = parse_layers("# plain lines, as for --layers-from\nerror\neval bag\n", "layers.txt")
    expect(index == {"error": 0, "eval": 1, "bag": 1}, f"a file of plain lines is a layers block (got {index})")
    _, _, probs = parse_layers("```layers\na\nb a\n```\n", "A.md")
    expect(probs == ["A.md:3: module a is in two layers: keep it on one line of the layers block"],
           f"a name in two layers is an error (got {probs})")

    # the stripper: comments (nested), strings (raw, byte, escaped), chars vs lifetimes
    s = strip_rust("a /* x /* y */ crate::z */ b // c\nr#\"crate::q\"# 'x' '\\'' fn f<'a>(_: &'a u8) { \"\\\"crate::w\" }")
    expect("crate" not in s and "fn f<'a>(_: &'a u8)" in s and s.count("\n") == 1, f"strip_rust: {s!r}")

    if failures:
        for f in failures:
            print(f"check_layers self-test FAILED: {f}")
        return 1
    print("check_layers self-test: all checks passed")
    return 0


# --------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the tree to check (default: this repository)")
    ap.add_argument("--layers-from", type=Path, metavar="FILE",
                    help="read the layers block from FILE instead of ROOT/ARCHITECTURE.md")
    ap.add_argument("--report", action="store_true", help="print the findings but exit 0")
    ap.add_argument("--edges", action="store_true", help="also print every edge")
    ap.add_argument("--self-test", action="store_true", help="run the checker's own tests")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    t0 = time.monotonic()
    root: Path = args.root
    layers_path = args.layers_from or root / "ARCHITECTURE.md"
    try:
        name = os.path.relpath(layers_path, root) if args.layers_from is None else str(layers_path)
    except ValueError:
        name = str(layers_path)
    if not (root / "src").is_dir():
        print(f"{root}/src: no such directory: point --root at the crate")
        return 1
    try:
        text = layers_path.read_text(encoding="utf-8")
    except OSError as e:
        print(f"{name}:1: cannot read the layers block ({e.strerror}): create it with a ```layers block")
        return 1
    try:
        res = check(root, text, name)
    except LayerError as e:
        print(e)
        return 1
    if args.edges:
        for e in sorted(res.edges, key=lambda e: (e.src.rel, e.line, e.dst.rel)):
            why = [w for w, on in (("pub use", e.how == "pub use"), ("test code", e.test)) if on]
            if not e.cycle and not why and e.src is not e.dst:
                why = ["module name"]
            tag = f" [{', '.join(why)}: layer rule only]" if why else ""
            print(f"{e.src.rel}:{e.line}: {e.shown} -> {e.dst.rel}{tag}")
    for _, p in res.problems:
        print(p)
    secs = time.monotonic() - t0
    pairs = len({(e.src.rel, e.dst.rel) for e in res.edges if e.src is not e.dst})
    summary = (f"{res.files} files read, {len(res.edges)} edges ({pairs} file pairs), {res.layers} layers"
               f" from {name}; {secs:.2f} s")
    if res.missing:
        summary += f"; listed but not in src/ (yet): {' '.join(res.missing)}"
    if res.problems:
        print(f"check_layers: {res.upward} upward import(s), {len(res.cycles)} file cycle(s), "
              f"{len(res.unlisted)} module(s) in no layer; {summary}")
        return 0 if args.report else 1
    print(f"check_layers: OK: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
