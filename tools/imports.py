#!/usr/bin/env python3
"""The module import graph of src/ (HACKING.md, "Layout").

Edges are file to file, read from paths outside comments and unit tests: `crate::…`,
`super::…`, `self::…`, and paths that start with a child module the file declares
(`mod outdir;` … `outdir::open(…)`), re-exports (`pub use self::x::Y`) included. An arrow
from a child to its own folder's `mod.rs` is an arrow like any other.

Fails (exit 1) on:
- a circle between files;
- a circle between the rooms of any folder, sub-folders included: inside a folder, each
  direct child (a file, or a sub-folder taken whole) and the folder's own `mod.rs` is one
  room, and the arrows between rooms must run one way (so a `mod.rs` that opens its
  children may not also be imported by them);
- an arrow from a lower layer of src/ up (LAYERS below: the order, top to bottom, that
  lib.rs's data-flow line describes), or a top-level module in no layer.

`--edges` prints every edge; `--rooms FOLDER` (e.g. `sink`) prints that folder's room arrows.
"""
import glob
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith('--')]
root = args[0] if args else 'src'
flags = sys.argv[1:]


def modpath(p):
    rel = os.path.relpath(p, root)[:-3].split('/')
    if rel[-1] in ('mod', 'lib', 'main'):
        rel = rel[:-1]
    return tuple(rel)


files = {modpath(p): p for p in glob.glob(f'{root}/**/*.rs', recursive=True)}
mods = set(files)


def longest(t):
    for n in range(len(t), -1, -1):
        if t[:n] in mods:
            return t[:n]
    return None


def resolve(cur, path, children):
    parts = path.split('::')
    if parts[0] == 'crate':
        return longest(tuple(parts[1:]))
    if parts[0] == 'super':
        base = cur[:-1]
        parts = parts[1:]
        while parts and parts[0] == 'super':
            base, parts = base[:-1], parts[1:]
        return longest(base + tuple(parts))
    if parts[0] == 'self':
        return longest(cur + tuple(parts[1:]))
    if parts[0] in children:
        return longest(cur + tuple(parts))
    return None


def strip(text):
    """The text without comments, string contents and test-only modules."""
    text = re.sub(r'//.*', '', text)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r'#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod \w+;', '', text)
    while True:
        m = re.search(r'#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod \w+\s*\{', text)
        if not m:
            return text
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += {'{': 1, '}': -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        text = text[:m.start()] + text[i + 1:]


edges = set()
for m, p in files.items():
    if m and m[-1] == 'tests':
        continue
    text = strip(open(p).read())
    children = set(re.findall(r'^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', text, flags=re.M))
    children.discard('tests')
    heads = ['crate', 'super', 'self'] + sorted(children)
    pattern = r'(?<![\w:])((?:' + '|'.join(heads) + r')(?:::\w+)+)'
    for u in re.findall(pattern, text):
        t = resolve(m, u, children)
        if t is not None and t != m and t != ('tests',) and not (t and t[-1] == 'tests'):
            edges.add((m, t))
# `use a::{b, c}` and `use self::{x, y}` groups: each name in braces after a module path.
for m, p in files.items():
    if m and m[-1] == 'tests':
        continue
    text = strip(open(p).read())
    children = set(re.findall(r'^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', text, flags=re.M))
    for head, inner in re.findall(r'\buse\s+((?:crate|super|self)(?:::\w+)*)::\{([^}]*)\}', text):
        for name in re.findall(r'\b(\w+)\b', inner):
            if name in ('self', 'as'):
                continue
            t = resolve(m, f'{head}::{name}', children)
            if t is not None and t != m and not (t and t[-1] == 'tests'):
                edges.add((m, t))

LAYERS = [('lib', 'main'), ('cli', 'settings'), ('daemon', 'list', 'webhook', 'serve', 'status'),
          ('sink',), ('batch',), ('fetch', 'validate', 'report', 'hub_report', 'ledger', 'template'),
          ('poll',), ('source',), ('https',), ('kube',), ('http',),
          ('ops', 'atomic', 'backoff', 'reason', 'secret', 'selector', 'names', 'words',
           'idmap', 'error', 'hub_protocol', 'locks')]


def layer(m):
    top = m[0] if m else 'lib'
    for i, l in enumerate(LAYERS):
        if top in l:
            return i
    return -1


def circles(nodes, g):
    idx, low, stack, on, out, c = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def sc(v):
        idx[v] = low[v] = c[0]
        c[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, []):
            if w not in idx:
                sc(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)
    for v in sorted(nodes):
        if v not in idx:
            sc(v)
    return out


def name(m):
    return '::'.join(m) or 'lib'


if '--edges' in flags:
    for a, b in sorted(edges):
        print(name(a), '->', name(b))

problems = 0
unlisted = sorted({m[0] for m in mods if m and layer(m) < 0})
for m in unlisted:
    print('UNLISTED', m, '(add it to LAYERS)')
problems += len(unlisted)
bad = [(a, b) for a, b in edges if layer(b) < layer(a)]
for a, b in sorted(bad):
    print('UP  ', name(a), '->', name(b))
problems += len(bad)

g = {}
for a, b in edges:
    g.setdefault(a, []).append(b)
file_circles = circles(mods, g)
for comp in file_circles:
    print('CIRCLE', ' <-> '.join(name(x) for x in comp))
problems += len(file_circles)

# Rooms of each folder: its mod.rs (the folder itself), and each direct child taken whole.
folders = {m[:-1] for m in mods if len(m) >= 1} | {m for m in mods if any(
    o[:len(m)] == m and len(o) > len(m) for o in mods)}
room_circles = 0
for f in sorted(folders):
    def room(m):
        if m == f:
            return '(mod.rs)' if f else '(lib.rs)'
        return m[len(f)]
    rg, rooms = {}, set()
    for a, b in edges:
        if a[:len(f)] == f and b[:len(f)] == f:
            ra, rb = room(a), room(b)
            if ra != rb:
                rg.setdefault(ra, set()).add(rb)
                rooms |= {ra, rb}
    if '--rooms' in flags and flags[flags.index('--rooms') + 1] == name(f):
        for a in sorted(rg):
            for b in sorted(rg[a]):
                print(f'{name(f)}: {a} -> {b}')
    if not f:
        continue  # the top level is held to LAYERS above
    for comp in circles(rooms, {k: sorted(v) for k, v in rg.items()}):
        print(f'ROOMS of {name(f)}/:', ' <-> '.join(sorted(comp)))
        room_circles += 1
problems += room_circles

print(f'{len(files)} files, {len(edges)} edges, {len(bad)} upward, '
      f'{len(file_circles)} circles, {room_circles} folder circles, {len(unlisted)} unlisted')
sys.exit(1 if problems else 0)
