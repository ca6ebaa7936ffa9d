#!/usr/bin/env python3
"""docs/USAGE.md's command reference is the binary's --help, and every path and flag the
docs name exists (scripts/gen_usage.py --check, scripts/check_paths.py --docs-only)."""
import os
import subprocess
import sys

src = os.environ.get('RK_SOURCE_DIR') or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
binary = os.environ.get('RK_BIN')
if not binary or not os.access(binary, os.X_OK):
    print(f'test_docs: no ridgekv binary (RK_BIN={binary!r})', file=sys.stderr)
    sys.exit(1)
rc = 0
for cmd in ([sys.executable, os.path.join(src, 'scripts', 'gen_usage.py'), binary, '--check'],
            [sys.executable, os.path.join(src, 'scripts', 'check_paths.py'), '--docs-only', '--bin', binary]):
    p = subprocess.run(cmd, cwd=src)
    if p.returncode != 0:
        print(f'test_docs: {" ".join(cmd[1:2])} failed (exit {p.returncode})', file=sys.stderr)
        rc = 1
sys.exit(rc)
