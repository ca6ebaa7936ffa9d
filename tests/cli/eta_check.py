#!/usr/bin/env python3
"""How true ask's ETA is on a real prefill: reads a long document (samples/docs repeated)
with the default model, one progress line per chunk, and compares the total predicted at the
first line past 10% of the work (elapsed + ETA) with the real prefill time, next to the plain
rate's guess (elapsed * total / done).
Usage: python3 tests/cli/eta_check.py [BIN] [TOKENS] [cpu]
With "cpu" the progress clock is the process's CPU time on one thread (RIDGEKV_PROGRESS_CLOCK=cpu,
-t 1): the cost model checked against the work itself, which a busy machine does not distort."""
import os, re, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.dirname(os.path.dirname(here))
bin_ = sys.argv[1] if len(sys.argv) > 1 else os.path.join(src, "build/cli/ridgekv")
want = int(sys.argv[2]) if len(sys.argv) > 2 else 7000
docs = [open(os.path.join(src, "samples/docs", f), encoding="utf-8").read()
        for f in sorted(os.listdir(os.path.join(src, "samples/docs")))]
text = ""
while len(text) < want * 4:
    text += "\n\n".join(docs)
text = text[:want * 4]
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(text)
cpu = len(sys.argv) > 3 and sys.argv[3] == "cpu"
env = dict(os.environ, RIDGEKV_PROGRESS_EVERY="0")
if cpu:
    env["RIDGEKV_PROGRESS_CLOCK"] = "cpu"
r = subprocess.run([bin_, "ask", "--no-cache", "--doc", f.name, "-c", "8192", "-n", "1"] + (["-t", "1"] if cpu else []) +
                   ["What is this about?"], capture_output=True, text=True, env=env)
os.unlink(f.name)
pat = re.compile(r"read (\d+)/(\d+) tokens \(\d+%\), [\d.]+ tok/s, elapsed ([\d.]+) s, ETA (\S+)")
rows = [(int(a), int(b), float(c), d) for a, b, c, d in pat.findall(r.stderr)]
if r.returncode != 0 or not rows:
    sys.exit("ask failed: " + r.stderr[-500:])
def secs(s):
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", s)
    return None if not m or s == "--" else int(m[1] or 0) * 3600 + int(m[2] or 0) * 60 + int(m[3] or 0)
total = rows[-1][1]
actual = rows[-1][2]
for done, tot, el, eta in rows:
    if 10 * done >= tot:
        pred, naive = el + secs(eta), el * tot / done
        print(f"{'CPU time, 1 thread: ' if cpu else ''}prefill {tot} tokens in {actual:.1f} s; at {done}/{tot} ({100*done/tot:.0f}%), elapsed {el:.1f} s: "
              f"model predicts {pred:.1f} s total ({100*(pred-actual)/actual:+.0f}%), "
              f"plain rate {naive:.1f} s ({100*(naive-actual)/actual:+.0f}%)")
        break
