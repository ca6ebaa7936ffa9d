#!/usr/bin/env python3
"""Every repository path and every ridgekv flag the docs name must exist.

Checked texts: README.md and docs/*.md (all of their text), and the comments of the code
(C, CUDA, headers, meson.build, shell and Python files tracked by git).

A *path* is
  - a token holding '/' whose first folder is one of the repository's top-level folders
    (runtime/, cli/, docs/, ...): it must exist (a file or a folder; '*' and '?' glob;
    a trailing ':LINE' is dropped);
  - a bare file name ending in a source or doc extension (.c .h .cu .cuh .py .sh .md):
    some tracked file must have that name;
  - a relative Markdown link target in a .md file: it must exist beside that file.
Not paths: URLs, names under ../, ~/, /, $VAR or a placeholder (<x>, {x}), and
build-tree paths (build/, build-asan/).

A *flag* is a '--word' in README.md or docs/*.md. It must appear in the --help of some
ridgekv command (with --bin: the binary's own help; without it: the string literals of
cli/, where the help text lives), unless the nearest command before it on the line is
another program (meson, pip, curl, a script of scripts/ ...), whose flags are its own.

The docs also stay short and speak of the product, not of how its work was organised:
docs/*.md hold fewer than DOC_LINES lines in all, and name no work session ("eighth
session"), helper or lead, nor a work machine's folders (/work/...).

usage: scripts/check_paths.py [--docs-only] [--bin build/cli/ridgekv]
  --docs-only  fail only on the docs; the code comments' findings are printed as notes
exit status: 0 clean, 1 findings, 2 bad usage.
"""
import fnmatch
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ('runtime', 'cli', 'docs', 'scripts', 'tests', 'kernels', 'io', 'formats', 'synth', 'eval',
       'fitters', 'base', 'tools', 'samples', 'fuzz', '.ci')
EXTS = ('.c', '.h', '.cu', '.cuh', '.py', '.sh', '.md')
CODE_EXTS = ('.c', '.h', '.cu', '.cuh', '.py', '.sh')
# programs whose flags are their own, not ridgekv's
OTHER = re.compile(r'(?:^|[\s`(|;&])(llama-cli|llama-server|meson|ninja|pip3?|python3 -m pip|curl|dd|cmake|valgrind|zstd|nvcc|git|'
                   r'apt-get|gzip|tar|lscpu|perf|make|gcc|clang|cc|time|xz|sha256sum|'
                   r'(?:\./)?(?:scripts|tests|samples|fuzz|build[\w-]*)/[\w./-]+|[\w./-]+\.py|test_[\w]+|lowram_study)(?=[\s`]|$)')
RIDGEKV = re.compile(r'(?:^|[\s`(/|;&])ridgekv(?=[\s`]|$)')
TOKEN = re.compile(r'[A-Za-z0-9_.*?+\-/:]+')
DOC_LINES = 3400
HISTORY = re.compile(r'\b(?:(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|'
                     r'\w+teenth|twentieth|twenty-\w+|thirtieth|\d+(?:st|nd|rd|th))(?:[-\s*/#]|//)+(?:session|round)s?\b|'
                     r'session (?:start|end)|helpers?\b|the lead\b)|/work/', re.I)
FLAG = re.compile(r'(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*')


def tracked_files():
    """The repository's files: git's list (tracked and not ignored), else a walk that skips
    build trees and hidden folders."""
    try:
        out = subprocess.run(['git', '-C', ROOT, 'ls-files', '--cached', '--others', '--exclude-standard'],
                             capture_output=True, text=True, check=True).stdout.split('\n')
        return [f for f in out if f and os.path.exists(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        res = []
        for d, dirs, fs in os.walk(ROOT):
            dirs[:] = [x for x in dirs if not x.startswith(('.', 'build')) or x == '.ci']
            res += [os.path.relpath(os.path.join(d, f), ROOT) for f in fs]
        return res


def comments(path, text):
    """(line number, comment text) of a code file."""
    res = []
    if path.endswith(('.c', '.h', '.cu', '.cuh')):
        # strings first (so "/*" inside a string is not a comment), then // and /* */
        pat = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
        for m in pat.finditer(text):
            s = m.group(0)
            if s.startswith('//') or s.startswith('/*'):
                line = text.count('\n', 0, m.start()) + 1
                for i, part in enumerate(s.split('\n')):
                    res.append((line + i, part))
    else:  # meson.build, shell, Python: '#' to the end of the line, outside quotes (roughly)
        for i, line in enumerate(text.split('\n'), 1):
            if line.startswith('#!'):
                continue
            q, j = None, 0
            while j < len(line):
                ch = line[j]
                if q:
                    if ch == '\\':
                        j += 1
                    elif ch == q:
                        q = None
                elif ch in '"\'':
                    q = ch
                elif ch == '#' and (j == 0 or line[j - 1] in ' \t(;'):
                    res.append((i, line[j:]))
                    break
                j += 1
        if path.endswith('.py'):  # docstrings count as comments too
            for m in re.finditer(r'"""(.*?)"""', text, re.S):
                line = text.count('\n', 0, m.start()) + 1
                for k, part in enumerate(m.group(1).split('\n')):
                    res.append((line + k, part))
    return res


def path_problems(text, names, base_dir, is_md):
    """Paths in one line of text that do not exist."""
    bad = []
    if is_md:
        for m in re.finditer(r'\]\(([^)\s]+)\)', text):
            t = m.group(1).split('#')[0]
            if not t or '://' in t or t.startswith('mailto:'):
                continue
            if not os.path.exists(os.path.normpath(os.path.join(base_dir, t))):
                bad.append(t)
    for m in TOKEN.finditer(text):
        tok = m.group(0)
        start = m.start()
        prev = text[start - 1] if start else ''
        if prev in '$~<{' or '://' in text[start:start + len(tok) + 3] or tok.startswith(('/', '..', '~')):
            continue
        if start >= 3 and text[max(0, start - 8):start].rstrip().endswith(('http:', 'https:', '://')):
            continue
        tok = re.sub(r':\d+(?:-\d+)?$', '', tok).rstrip('.,:;')
        tok = tok.lstrip('-+')
        if '/' in tok:
            first = tok.split('/')[0]
            if first not in TOP or tok.startswith(('build/', 'build-')):
                continue
            if text[m.end():m.end() + 1] in ('<', '{', '$'):
                continue  # a placeholder follows (docs/data-<x>.jsonl)
            full = os.path.join(ROOT, tok)
            if any(c in tok for c in '*?'):
                if not glob.glob(full):
                    bad.append(tok)
            elif not os.path.exists(full.rstrip('/')):
                bad.append(tok)
        elif tok.endswith(EXTS) and re.match(r'^[A-Za-z0-9_][\w*?-]+\.[\w.]+$', tok):
            if text[m.end():m.end() + 1] in ('<', '{', '$') or prev in ('-', '*'):
                continue
            if any(c in tok for c in '*?'):
                if not any(fnmatch.fnmatch(n, tok) for n in names):
                    bad.append(tok)
            elif tok not in names:
                bad.append(tok)
    return bad


def help_flags(binary):
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import gen_usage  # noqa: E402
    flags = set()
    for _, text in gen_usage.help_texts(binary):
        flags.update(FLAG.findall(text))
    return flags


def source_flags():
    flags = set()
    for f in glob.glob(os.path.join(ROOT, 'cli', '*.[ch]')):
        with open(f, encoding='utf-8', errors='replace') as fh:
            for s in re.findall(r'"(?:\\.|[^"\\\n])*"', fh.read()):
                flags.update(FLAG.findall(s))
    return flags


def flag_problems(line, known, prefix=''):
    """Flags of line that no command takes; prefix: the lines it continues (a trailing '\\')."""
    bad = []
    for m in FLAG.finditer(line):
        f = m.group(0)
        if f in known:
            continue
        before = prefix + line[:m.start()]
        other = [o.end() for o in OTHER.finditer(before)]
        ours = [o.end() for o in RIDGEKV.finditer(before)]
        if other and (not ours or max(other) > max(ours)):
            continue
        bad.append(f)
    return bad


def main(argv):
    docs_only, binary = False, None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == '--docs-only':
            docs_only = True
        elif a == '--bin' and args:
            binary = args.pop(0)
        else:
            print(__doc__.strip().split('\n\n')[-1], file=sys.stderr)
            return 2
    files = tracked_files()
    names = {os.path.basename(f) for f in files}
    known = help_flags(binary) if binary else source_flags()
    doc_files = ['README.md'] + sorted(f for f in files if f.startswith('docs/') and f.endswith('.md'))
    doc_bad, code_bad = [], []
    n_lines = 0
    for f in doc_files:
        with open(os.path.join(ROOT, f), encoding='utf-8') as fh:
            prefix = ''
            for i, line in enumerate(fh, 1):
                n_lines += f.startswith('docs/')
                h = HISTORY.search(line)
                if h:
                    doc_bad.append(f'{f}:{i}: names how the work was organised, not the product: {h.group(0)!r}')
                for p in path_problems(line, names, os.path.dirname(os.path.join(ROOT, f)), True):
                    doc_bad.append(f'{f}:{i}: no such path: {p}')
                for fl in flag_problems(line, known, prefix):
                    doc_bad.append(f'{f}:{i}: no ridgekv command takes {fl}')
                prefix = prefix + line.rstrip('\n')[:-1] + ' ' if line.rstrip().endswith('\\') else ''
    if n_lines >= DOC_LINES:
        doc_bad.append(f'docs/*.md: {n_lines} lines in all (at most {DOC_LINES - 1})')
    for f in files:
        if not (f.endswith(CODE_EXTS) or os.path.basename(f) == 'meson.build'):
            continue
        with open(os.path.join(ROOT, f), encoding='utf-8', errors='replace') as fh:
            text = fh.read()
        for i, c in comments(f, text):
            for p in path_problems(c, names, ROOT, False):
                code_bad.append(f'{f}:{i}: no such path: {p}')
    for b in doc_bad:
        print(b)
    for b in code_bad:
        print(('note: ' if docs_only else '') + b)
    n_fail = len(doc_bad) + (0 if docs_only else len(code_bad))
    print(f'check_paths: {len(doc_files)} docs, {len(doc_bad)} findings; code comments: {len(code_bad)} findings'
          + (' (notes only)' if docs_only else ''), file=sys.stderr)
    return 1 if n_fail else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
