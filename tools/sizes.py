#!/usr/bin/env python3
"""The size of each room of src/ (HACKING.md, "Layout"): so that a feature splits a room
instead of filling it.

Counts lines of code: lines with something besides comments and blanks, outside unit tests
(an item under `#[cfg(test)]`, and a file its parent declares under `#[cfg(test)]`).
Fails (exit 1) when a file has more than FILE_MOST lines of code, or a function (its
signature to its closing brace) more than FN_MOST, unless the file is named in LARGER
below with its own bound and the reason it may be larger.

Measures types too, so that a feature that would fill a type has to cut it rather than
move part of its `impl` into a child file: a struct may have FIELDS_MOST named fields,
and its inherent `impl` blocks — anywhere in the tree when no other struct has its name,
else in its own file and in the files of that file's room (`x.rs`'s `x/`, `mod.rs`'s
folder) — IMPL_MOST lines of code in all (a tuple struct's too), unless the type is
named in WIDER below (as `file::Type`) with its own bounds and the reason.

`--all` prints every file's count and its largest function; `--top N` the N largest files;
`--types` every struct's fields and impl lines.
"""
import glob
import os
import re
import sys

FILE_MOST = 600
FN_MOST = 120

# A file that may be larger, its bound, and why (one line).
LARGER = {
    'selector.rs': (800, "the label and field selector grammar, messages included, as one parser"),
    'source/reader.rs': (800, "the streaming list reader: one parser of the apiserver's JSON"),
}

FIELDS_MOST = 12
# Most of a file: a type is one unit a reader holds, wherever its methods are written.
IMPL_MOST = 500

# A type that may have more fields, its bounds (fields, impl lines), and why (one line):
# plain data, each field one setting, one count or one fact, read by name.
WIDER = {
    'https/server/limits.rs::Limits': (17, IMPL_MOST, "the hub's bounds, one field per flag or constant, plain data"),
    'ops/metrics.rs::Metrics': (18, IMPL_MOST, "one field per metric family of SPEC's /metrics"),
    'kube/kubeconfig.rs::RawAuthInfo': (14, IMPL_MOST, "a kubeconfig's users[].user as the file has it (client-go's AuthInfo)"),
    'kube/kubeconfig.rs::AuthInfo': (14, IMPL_MOST, "RawAuthInfo read: the same fields, checked"),
    'batch/observe.rs::Record': (14, IMPL_MOST, "what one commit did, one fact per field, each read by an observer"),
    'serve/mod.rs::Options': (14, IMPL_MOST, "cmpoll serve's options as settings decided them: one field per flag or flag group, plain data"),
}

args = [a for a in sys.argv[1:] if not a.startswith('--')]
root = args[0] if args else 'src'
flags = sys.argv[1:]


def strip(text):
    """`text` with comments, string and char literals blanked (newlines kept), so that
    braces and `fn` are only code's own."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif text.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith('/*', j):
                    depth, j = depth + 1, j + 2
                elif text.startswith('*/', j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i:i + 20]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            m = re.match(r'b?r(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append('""' + re.sub(r'[^\n]', ' ', text[i + 2:j]))
            i = j
        elif c == '"' or (c == 'b' and text.startswith('b"', i)):
            j = i + (2 if c == 'b' else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            out.append('""' + re.sub(r'[^\n]', ' ', text[i + 2:j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('{', '\n', '\u{7f}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append("' '" + ' ' * (m.end() - 3))
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def close_of(code, at):
    """Where the brace opened at `at` closes."""
    depth = 0
    for j in range(at, len(code)):
        if code[j] == '{':
            depth += 1
        elif code[j] == '}':
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def test_spans(code):
    """Spans of items under `#[cfg(test)]`."""
    spans = []
    for m in re.finditer(r'#\[cfg\(test\)\]', code):
        j = m.end()
        # A field or a variant under it: up to its `,`.
        field = re.match(r'\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?(?:r#)?[a-z_][a-z0-9_]*\s*:(?!:)', code[j:])
        if field:
            comma = code.find(',', j + field.end())
            spans.append((m.start(), comma if comma >= 0 else j + field.end()))
            continue
        # The item's end: its block, or a `;` (`mod tests;`) before any block.
        brace, semi = code.find('{', j), code.find(';', j)
        if semi >= 0 and (brace < 0 or semi < brace):
            spans.append((m.start(), semi))
        elif brace >= 0:
            spans.append((m.start(), close_of(code, brace)))
    return spans


def line_of(code, pos):
    return code.count('\n', 0, pos)


def counted_lines(code, spans):
    """The set of line numbers with code, outside `spans`."""
    lines = code.split('\n')
    out_of_tests = set(range(len(lines)))
    for a, b in spans:
        out_of_tests -= set(range(line_of(code, a), line_of(code, b) + 1))
    return {i for i in out_of_tests if lines[i].strip()}


def functions(code, spans, counted):
    """(name, lines of code) of each function outside `spans`."""
    out = []
    for m in re.finditer(r'\bfn\s+([A-Za-z_][A-Za-z0-9_]*)', code):
        if any(a <= m.start() <= b for a, b in spans):
            continue
        brace, semi = code.find('{', m.end()), code.find(';', m.end())
        if brace < 0 or (0 <= semi < brace and code.count('(', m.end(), semi) == code.count(')', m.end(), semi)):
            continue  # a declaration without a body
        end = close_of(code, brace)
        first, last = line_of(code, m.start()), line_of(code, end)
        out.append((m.group(1), len([i for i in range(first, last + 1) if i in counted])))
    return out


def generics_end(code, at):
    """Past the `<...>` opened at `at` (angle brackets balanced; `->` is not one)."""
    depth = 0
    for j in range(at, len(code)):
        if code[j] == '<':
            depth += 1
        elif code[j] == '>' and code[j - 1] != '-':
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def structs(code, spans):
    """(name, named fields) of each struct outside `spans` (a tuple or unit struct has
    none, and its impl blocks are measured all the same)."""
    out = []
    for m in re.finditer(r'\bstruct\s+([A-Za-z_][A-Za-z0-9_]*)', code):
        if any(a <= m.start() <= b for a, b in spans):
            continue
        j = m.end()
        if j < len(code) and code[j] == '<':
            j = generics_end(code, j)
        rest = code[j:].lstrip()
        brace = code.find('{', j)
        if rest[:1] in ('(', ';') or brace < 0:
            out.append((m.group(1), 0))  # a tuple or unit struct
            continue
        end = close_of(code, brace)
        depth, fields, at = 0, 0, brace + 1
        for line in code[brace + 1:end].split('\n'):
            inside = any(a <= at <= b for a, b in spans)
            if depth == 0 and not inside:
                fields += len(re.findall(r'(?:^|,)\s*(?:pub(?:\([^)]*\))?\s+)?(?:r#)?[a-z_][a-z0-9_]*\s*:(?!:)', line))
            depth += line.count('{') + line.count('(') + line.count('[') + line.count('<')
            depth -= line.count('}') + line.count(')') + line.count(']') + line.count('>') - line.count('->')
            at += len(line) + 1
        out.append((m.group(1), fields))
    return out


def inherent_impls(code, spans, counted):
    """(type name, lines of code) of each inherent `impl` block outside `spans`."""
    out = []
    # An item (`impl` at a line's start), not an `impl Trait` argument or return type.
    for m in re.finditer(r'^[ \t]*(?:unsafe[ \t]+)?impl\b', code, re.M):
        if any(a <= m.start() <= b for a, b in spans):
            continue
        j = m.end()
        while j < len(code) and code[j].isspace():
            j += 1
        if j < len(code) and code[j] == '<':
            j = generics_end(code, j)
        brace = code.find('{', j)
        if brace < 0:
            continue
        head = code[j:brace]
        if re.search(r'\bfor\b(?!\s*<)', head) or ';' in head:
            continue  # a trait's impl (`for<'a>` is a bound's)
        name = re.match(r'\s*(?:[A-Za-z_][A-Za-z0-9_]*::)*([A-Za-z_][A-Za-z0-9_]*)', head)
        if not name:
            continue
        end = close_of(code, brace)
        first, last = line_of(code, m.start()), line_of(code, end)
        out.append((name.group(1), len([i for i in range(first, last + 1) if i in counted])))
    return out


def room_of(rel):
    """The folder a file's child files live in."""
    base, stem = os.path.dirname(rel), os.path.basename(rel)[:-3]
    return base if stem in ('mod', 'lib', 'main') else os.path.join(base, stem)


def impl_lines(rel, name, defined, impls):
    """The lines of `name`'s inherent impl blocks: wherever they are when no other struct
    of `src/` has its name; else in its own file and its room's files."""
    unique = sum(1 for _, t, _ in defined if t == name) == 1
    room = room_of(rel)
    return sum(n for f, t, n in impls
               if t == name and (unique or f == rel or (room and f.startswith(room + os.sep))))


def type_failures(defined, impls):
    """The types over their bounds: `defined` is [(file, name, fields)], `impls`
    [(file, name, lines)]."""
    failures = []
    for rel, name, fields in defined:
        key = f'{rel}::{name}'
        fields_most, impl_most, _ = WIDER.get(key, (FIELDS_MOST, IMPL_MOST, None))
        lines = impl_lines(rel, name, defined, impls)
        if fields > fields_most:
            failures.append(f'{key}: {fields} fields (at most {fields_most}): cut the type')
        if lines > impl_most:
            failures.append(f'{key}: {lines} lines of code in its impl blocks, across its room (at most {impl_most}): cut the type')
    return failures


def test_files(root):
    """Files their parent declares under `#[cfg(test)]`."""
    found = set()
    for p in glob.glob(f'{root}/**/*.rs', recursive=True):
        text = strip(open(p).read())
        base = os.path.dirname(p)
        stem = os.path.basename(p)[:-3]
        folder = base if stem in ('mod', 'lib', 'main') else os.path.join(base, stem)
        for m in re.finditer(r'#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;', text):
            for cand in (os.path.join(folder, m.group(1) + '.rs'), os.path.join(folder, m.group(1), 'mod.rs')):
                found.add(os.path.normpath(cand))
    return found


def main():
    tests = test_files(root)
    rows, failures = [], []
    defined, impls = [], []
    for p in sorted(glob.glob(f'{root}/**/*.rs', recursive=True)):
        if os.path.normpath(p) in tests:
            continue
        rel = os.path.relpath(p, root)
        code = strip(open(p).read())
        spans = test_spans(code)
        counted = counted_lines(code, spans)
        fns = functions(code, spans, counted)
        defined += [(rel, name, n) for name, n in structs(code, spans)]
        impls += [(rel, name, n) for name, n in inherent_impls(code, spans, counted)]
        most, why = LARGER.get(rel, (FILE_MOST, None))
        loc = len(counted)
        big = max(fns, key=lambda f: f[1], default=('-', 0))
        rows.append((loc, rel, big))
        if loc > most:
            failures.append(f'{rel}: {loc} lines of code (at most {most}): split the room')
        for name, n in fns:
            if n > FN_MOST:
                failures.append(f'{rel}: fn {name} has {n} lines of code (at most {FN_MOST})')
    failures += type_failures(defined, impls)
    if '--types' in flags:
        for rel, name, fields in sorted(defined, key=lambda d: -d[2]):
            lines = impl_lines(rel, name, defined, impls)
            print(f'{fields:3} fields {lines:4} impl lines  {rel}::{name}')
    if '--all' in flags or '--top' in flags:
        top = len(rows)
        if '--top' in flags:
            top = int(sys.argv[sys.argv.index('--top') + 1])
        for loc, rel, (name, n) in sorted(rows, reverse=True)[:top]:
            print(f'{loc:5} {rel}  (largest fn {name}: {n})')
    total = sum(r[0] for r in rows)
    print(f'{len(rows)} files, {total} lines of code; {len(failures)} over their bounds')
    for f in failures:
        print('  ' + f)
    for rel, (most, why) in LARGER.items():
        print(f'  {rel} may have {most}: {why}')
    for key, (fields, lines, why) in WIDER.items():
        print(f'  {key} may have {fields} fields and {lines} impl lines: {why}')
    sys.exit(1 if failures else 0)


main()
