#!/usr/bin/env python3
"""The size of each room of src/ (HACKING.md, "Layout"): so that a feature splits a room
instead of filling it.

Counts lines of code: lines with something besides comments and blanks, outside unit tests
(an item under `#[cfg(test)]`, and a file its parent declares under `#[cfg(test)]`).
Fails (exit 1) when a file has more than FILE_MOST lines of code, or a function (its
signature to its closing brace) more than FN_MOST, unless the file is named in LARGER
below with its own bound and the reason it may be larger.

`--all` prints every file's count and its largest function; `--top N` the N largest files.
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
    for p in sorted(glob.glob(f'{root}/**/*.rs', recursive=True)):
        if os.path.normpath(p) in tests:
            continue
        rel = os.path.relpath(p, root)
        code = strip(open(p).read())
        spans = test_spans(code)
        counted = counted_lines(code, spans)
        fns = functions(code, spans, counted)
        most, why = LARGER.get(rel, (FILE_MOST, None))
        loc = len(counted)
        big = max(fns, key=lambda f: f[1], default=('-', 0))
        rows.append((loc, rel, big))
        if loc > most:
            failures.append(f'{rel}: {loc} lines of code (at most {most}): split the room')
        for name, n in fns:
            if n > FN_MOST:
                failures.append(f'{rel}: fn {name} has {n} lines of code (at most {FN_MOST})')
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
    sys.exit(1 if failures else 0)


main()
