#!/usr/bin/env python3
"""The module import graph of src/ (HACKING.md, "Layout"): file-level edges from
`crate::…`, `super::…` and `self::…` paths outside comments and unit tests. Fails (exit 1)
on a circle between files or an arrow from a lower layer up; LAYERS below is the order,
top to bottom, that lib.rs's data-flow line describes."""
import re, glob, os, sys, itertools

root = sys.argv[1] if len(sys.argv) > 1 else 'src'
def modpath(p):
    rel = os.path.relpath(p, root)[:-3].split('/')
    if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
    return tuple(rel)
files = {modpath(p): p for p in glob.glob(f'{root}/**/*.rs', recursive=True)}
mods = set(files)
def resolve(cur, path):
    parts = path.split('::')
    if parts[0] == 'crate': base = ()
    elif parts[0] == 'super':
        base = cur[:-1] if not files[cur].endswith(('mod.rs',)) else cur[:-1]
        # a file module foo.rs: super = its parent; a mod.rs folder module: super = parent too
        parts = parts[1:]
        while parts and parts[0] == 'super': base = base[:-1]; parts = parts[1:]
        return longest(base + tuple(parts))
    elif parts[0] == 'self': base = cur
    else: return None
    return longest(base + tuple(parts[1:]))
def longest(t):
    for n in range(len(t), -1, -1):
        if t[:n] in mods: return t[:n]
    return None
edges = set()
for m, p in files.items():
    text = open(p).read()
    text = re.sub(r'#\[cfg\(test\)\]\s*mod tests \{.*', '', text, flags=re.S)
    text = re.sub(r'//.*', '', text)
    if m and m[-1] == 'tests': continue
    for u in re.findall(r'\b((?:crate|super|self)(?:::\w+)+)', text):
        t = resolve(m, u)
        if t is not None and t != m and not (len(t) < len(m) and m[:len(t)] == t):
            edges.add((m, t))
LAYERS = [('lib', 'main'), ('cli', 'settings'), ('daemon', 'list', 'webhook', 'status'), ('batch',), ('fetch', 'validate', 'report', 'ledger'), ('sink',), ('poll',),
          ('source',), ('kube',), ('http',), ('ops', 'backoff', 'secret', 'selector', 'names', 'words', 'idmap', 'error')]
def layer(m):
    top = m[0] if m else 'lib'
    for i, l in enumerate(LAYERS):
        if top in l: return i
    return -1
unlisted = sorted({m[0] for m in mods if m and layer(m) < 0})
for m in unlisted: print('UNLISTED', m, '(add it to LAYERS)')
bad = [(a, b) for a, b in edges if layer(b) < layer(a)]
for a, b in sorted(bad): print('UP  ', '::'.join(a), '->', '::'.join(b))
# cycles (Tarjan)
idx, low, stack, on, out, c = {}, {}, [], set(), [], [0]
g = {}
for a, b in edges: g.setdefault(a, []).append(b)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; stack.append(v); on.add(v)
    for w in g.get(v, []):
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(comp)
sys.setrecursionlimit(10000)
for v in list(mods):
    if v not in idx: sc(v)
for comp in out: print('CIRCLE', ' <-> '.join('::'.join(x) or 'lib' for x in comp))
print(f'{len(files)} files, {len(edges)} edges, {len(bad)} upward, {len(out)} circles, {len(unlisted)} unlisted')
sys.exit(1 if bad or out or unlisted else 0)
