#!/usr/bin/env python3
"""What a llama.cpp / ollama user sees, through the binary, on a generated model (ridgekv
synth: no downloads, no ../shared):

- the terminal: ask's bar on a pseudo-terminal of 60, 80 and 120 columns (a small screen
  model replays what was written: no line ever wraps, one bar line is left, ended before
  the answer; with stdout on a pipe nothing of the bar is on stdout), a window shrunk
  while the bar runs, chat's bar on a long message (shown, then erased) and none on a short
  one, and no answer text after ask's Ctrl-C "stopping" notice;
- habits: `run MODEL PROMPT`, llama.cpp flags refused naming ridgekv's, "did you mean" for
  commands and flags, `-m NAME` suggesting catalogue names, serve --host/--port;
- output at the edges: a length cut inside a multi-byte character (CLI and JSONL: the text
  of n tokens is a prefix of the text of more), libmicrohttpd's bind failure in our words;
- quieter defaults: no RidgeFill line for a prompt it does not change, one short line
  for one it does, /save's sizes, pull's --prepare hint only without cached maps (with the
  real cache's default model and maps, when there).
Exit 77 = skipped (meson)."""
import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time

BIN = os.environ.get("RK_BIN")
FAILS = []
RFC = "\ufffd"


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)
        if detail:
            print("     " + detail.replace("\n", "\n     ")[:3000], flush=True)


class Screen:
    """A terminal of cols columns, as xterm draws it: printable characters advance the
    cursor and wrap after the last column (the wrap happens when the next character
    comes), \\r returns, \\n moves down, ESC[K erases to the end of the line."""

    def __init__(self, cols):
        self.cols, self.lines, self.x, self.y, self.pending, self.wraps = cols, [[]], 0, 0, False, 0

    def _row(self):
        while len(self.lines) <= self.y:
            self.lines.append([])
        return self.lines[self.y]

    def feed(self, text):
        i = 0
        while i < len(text):
            c = text[i]
            if c == "\x1b":
                m = re.match(r"\x1b\[([0-9;?]*)([A-Za-z])", text[i:])
                if m:
                    if m.group(2) == "K" and m.group(1) in ("", "0"):
                        del self._row()[self.x:]
                    i += len(m.group(0))
                else:
                    i += 2
                continue
            if c == "\r":
                self.x, self.pending = 0, False
            elif c == "\n":
                self.y, self.pending = self.y + 1, False
                self._row()
            elif c == "\b":
                self.x = max(0, self.x - 1)
            elif c >= " ":
                if self.pending:
                    self.y, self.x, self.pending = self.y + 1, 0, False
                    self.wraps += 1
                row = self._row()
                while len(row) < self.x:
                    row.append(" ")
                if self.x < len(row):
                    row[self.x] = c
                else:
                    row.append(c)
                self.x += 1
                if self.x == self.cols:
                    self.x, self.pending = self.cols - 1, True
            i += 1

    def text(self):
        return ["".join(r).rstrip() for r in self.lines]


def spawn(argv, cols, stdout_pipe=False, stdin_text=None, env=None):
    """argv on a pseudo-terminal of cols columns (stderr there; stdout too unless
    stdout_pipe; stdin there unless stdin_text, which is piped in)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin_text is not None else slave,
                         stdout=subprocess.PIPE if stdout_pipe else slave, stderr=slave, start_new_session=True,
                         env=env)
    os.close(slave)
    if stdin_text is not None:
        p.stdin.write(stdin_text.encode())
        p.stdin.close()
    return p, master


def collect(p, master, timeout=120, until=None):
    """Reads the terminal (and a piped stdout) until the child exits; until(term_text)
    returning True stops early. Returns (terminal bytes, stdout bytes, exit code)."""
    term, out, end = b"", b"", time.time() + timeout
    fds = [master] + ([p.stdout] if p.stdout else [])
    while fds and time.time() < end:
        r, _, _ = select.select(fds, [], [], 0.05)
        for f in r:
            try:
                data = os.read(f if f == master else f.fileno(), 65536)
            except OSError:
                data = b""
            if not data:
                fds.remove(f)
            elif f == master:
                term += data
            else:
                out += data
        if until and until(term):
            return term, out, None
        if p.poll() is not None and not r:
            break
    try:
        code = p.wait(timeout=max(1, end - time.time()))
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    os.close(master)
    return term, out, code


def run(args, stdin=None, env=None, timeout=120):
    return subprocess.run([BIN] + args, input=stdin, capture_output=True, text=True, env=env, timeout=timeout)


def words(n, seed=1):
    w = "the cat sat on a mat and ran to the park with a big red ball while birds sang".split()
    return " ".join(w[(i * 7 + seed) % len(w)] for i in range(n))


def test_ask_bar(model, doc):
    for cols in (60, 80, 120):
        argv = [BIN, "ask", "-m", model, "--doc", doc, "-b", "16", "-n", "4", "--temp", "0", "--no-cache", "what?"]
        p, m = spawn(argv, cols)
        term, _, code = collect(p, m)
        text = term.decode("utf-8", "replace")
        s = Screen(cols)
        # the bar's wraps: from its first draw to the answer (log lines around it may wrap)
        bar0, ans0 = text.find("\rread ["), text.find(RFC)
        s.feed(text[:bar0])
        w0 = s.wraps
        s.feed(text[bar0:ans0])
        wraps = s.wraps - w0
        s.feed(text[ans0:])
        lines = s.text()
        bars = [ln for ln in lines if ln.startswith("read [")]
        check(code == 0, f"ask at {cols} columns exits 0", text)
        check(text.count("\rread [") >= 5, f"ask at {cols} columns redraws the bar in place", text)
        check(wraps == 0, f"ask at {cols} columns: no line wraps (the bar fits the width)", repr(text))
        check(len(bars) == 1 and "100%" in bars[0] and bars[0].rstrip().endswith("ETA 0s"),
              f"ask at {cols} columns: one bar line left, at 100%, ended before the answer", "\n".join(lines))
        ans = [ln for ln in lines if RFC in ln]
        check(len(ans) == 1 and not ans[0].startswith("read") and "ETA" not in ans[0],
              f"ask at {cols} columns: the answer is on a line of its own", "\n".join(lines))
        # stdout on a pipe: the answer alone, nothing of the bar
        p, m = spawn(argv, cols, stdout_pipe=True)
        term, out, code = collect(p, m)
        o = out.decode("utf-8", "replace")
        check(code == 0 and RFC in o and not re.search(r"\r|\x1b|read|ETA", o),
              f"ask at {cols} columns, stdout on a pipe: only the answer on stdout", repr(o))
        check("\rread [" in term.decode("utf-8", "replace"), f"ask at {cols} columns: the bar is on stderr")


def test_resize(model, doc):
    # the width is read again at every redraw: after the window shrinks to 50 columns the
    # bar's lines fit 50 columns
    argv = [BIN, "ask", "-m", model, "--doc", doc, "--backend", "cpu_ref", "-t", "1", "-b", "8", "-n", "1",
            "--temp", "0", "--no-cache", "what?"]
    p, m = spawn(argv, 120)
    term, _, _ = collect(p, m, timeout=120, until=lambda t: t.count(b"\rread [") >= 3)
    fcntl.ioctl(m, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 50, 0, 0))
    mark = len(term)
    rest, _, code = collect(p, m, timeout=300)
    text = (term + rest).decode("utf-8", "replace")
    wide = re.findall(r"\rread \[[^\r\x1b]*", text[:mark])
    after = re.findall(r"\rread \[[^\r\x1b]*", (term + rest)[mark:].decode("utf-8", "replace"))[1:]
    check(code == 0 and wide and max(len(w) for w in wide) > 60, "ask at 120 columns draws a wide bar", text)
    check(after and max(len(a) - 1 for a in after) <= 49, "after a resize to 50 columns the bar fits 50 columns",
          "\n".join(after[-3:]))


def test_chat_bar(model, tmp):
    # a long message read by the scalar kernels on one thread takes seconds: the bar shows,
    # then is erased before the answer
    msg = words(150) + "\n"
    argv = [BIN, "chat", "-m", model, "--backend", "cpu_ref", "-t", "1", "-b", "16", "-n", "3", "--temp", "0"]
    p, m = spawn(argv, 80, stdin_text=msg)
    term, _, code = collect(p, m, timeout=300)
    text = term.decode("utf-8", "replace")
    s = Screen(80)
    s.feed(text)
    lines = s.text()
    check(code == 0, "chat on a long message exits 0", text)
    check("\rread [" in text, "chat shows a bar while a long message is read", text)
    check(not any("read [" in ln for ln in lines),
          "chat's bar is erased before the answer (nothing of it left on the screen)", "\n".join(lines))
    check(any(ln.startswith("ridgekv chat: [answer cut: -n 3") for ln in lines),
          "chat's notices after the answer are on lines of their own", "\n".join(lines))
    # a short message, read fast: no bar at all
    p, m = spawn([BIN, "chat", "-m", model, "-n", "2", "--temp", "0"], 80, stdin_text="hi\n")
    term, _, code = collect(p, m)
    text = term.decode("utf-8", "replace")
    check(code == 0 and "read [" not in text, "chat shows no bar for a short message", text)


def test_ctrl_c(model, doc):
    argv = [BIN, "ask", "-m", model, "--doc", doc, "--backend", "cpu_ref", "-t", "1", "-n", "2000", "--temp", "0",
            "--no-cache", "what?"]
    p, m = spawn(argv, 120)

    def answering(t):
        return t.decode("utf-8", "replace").count(RFC) >= 3

    term, _, _ = collect(p, m, timeout=120, until=answering)
    os.killpg(p.pid, signal.SIGINT)
    rest, _, code = collect(p, m, timeout=60)
    text = (term + rest).decode("utf-8", "replace")
    check(code == 130, "ask stopped by Ctrl-C exits 130", text)
    at = text.find("stopping (Ctrl-C again")
    check(at >= 0, "ask says it is stopping", text)
    after = text[at:].split("\n", 1)[1] if at >= 0 else ""
    check(RFC not in after, "no answer text after the stopping notice", repr(after))


def test_habits(model):
    r = run(["run", model, "hello", "-n", "2", "--temp", "0"])
    check(r.returncode == 0 and len(r.stdout) > 1, "`run MODEL PROMPT`: a GGUF path first is the model", r.stderr)
    r = run(["run", "smollm2-135m"])
    check(r.returncode == 2 and "no prompt for smollm2-135m" in r.stderr and "ridgekv chat -m smollm2-135m" in r.stderr,
          "`run CATALOGUE-NAME` without a prompt: the name is the model, the prompt is asked for", r.stderr)
    cases = [(["run", "-ngl", "99", "-p", "x"], "--backend cuda"), (["run", "-ctk", "q8_0", "-p", "x"], "--kv q8"),
             (["run", "-ctv", "q4_0", "-p", "x"], "--kv q4"), (["chat", "-sys", "hi"], "--system TEXT"),
             (["run", "--temperature", "0.5"], "--temp T"), (["run", "-fa", "-p", "x"], "no flash-attention"),
             (["run", "-s", "3"], "--seed S"), (["run", "--predict", "3"], "-n N"),
             (["ask", "-ub", "64"], "-b N"), (["run", "--mlock"], "mapped read-only"),
             (["run", "--host", "0.0.0.0"], "serve --http")]
    for args, want in cases:
        r = run(args)
        check(r.returncode == 2 and "llama.cpp's flag" in r.stderr and want in r.stderr,
              f"{' '.join(args)}: refused naming {want}", r.stderr)
    for args, want in [(["chta"], "did you mean 'chat'"), (["servr"], "did you mean 'serve'"),
                       (["list"], "ridgekv models"), (["run", "--tmep", "1"], "did you mean --temp"),
                       (["ask", "-temp", "1"], "did you mean --temp"), (["serve", "--jsnl"], "did you mean --jsonl"),
                       (["smollm2-135m"], "ridgekv run smollm2-135m")]:
        r = run(args)
        check(r.returncode == 2 and want in r.stderr, f"{' '.join(args)}: {want}", r.stderr)
    r = run(["run", "--zzzzzz"])
    check(r.returncode == 2 and "did you mean" not in r.stderr and "unknown option '--zzzzzz'" in r.stderr,
          "a flag near nothing gets no suggestion", r.stderr)
    r = run(["run", "-m", "qwen", "-p", "x"])
    check(r.returncode == 3 and "qwen2.5-coder-1.5b" in r.stderr and "ridgekv models" in r.stderr,
          "-m qwen names the nearest catalogue model and `ridgekv models`", r.stderr)


def test_utf8_cut(model):
    # sampling over byte tokens writes multi-byte characters split across tokens; the text
    # of n tokens must be a prefix of the text of more (no U+FFFD for a cut character)
    samp = ["--temp", "2", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "2"]
    outs = [run(["run", "-m", model, "-p", "hello", "-n", str(n)] + samp).stdout.encode("utf-8", "surrogateescape")
            for n in range(1, 41)]
    full = outs[-1].rstrip(b"\n")
    bad = [n + 1 for n, o in enumerate(outs) if not full.startswith(o.rstrip(b"\n"))]
    check(not bad, "run: the text of -n N is a prefix of the text of -n 40 (no U+FFFD for a cut)", f"bad N: {bad}")
    split = [n + 1 for n in range(len(outs) - 1)
             if outs[n + 1].rstrip(b"\n")[len(outs[n].rstrip(b"\n")):][:1] >= b"\xc2"
             and outs[n + 1].rstrip(b"\n")[len(outs[n].rstrip(b"\n")):][:3] != RFC.encode()]
    check(bool(split), "the run has a character split across tokens (the case above is exercised)",
          repr(full))
    reqs = "".join(json.dumps({"id": n, "op": "complete", "prompt": "hello", "max_tokens": n, "temperature": 2,
                               "top_k": 0, "top_p": 1, "min_p": 0, "seed": 2}) + "\n" for n in range(1, 41))
    r = run(["serve", "--jsonl", "-m", model], stdin=reqs)
    texts = {}
    for line in r.stdout.splitlines():
        ev = json.loads(line)
        texts[ev["id"]] = texts.get(ev["id"], "") + ev.get("text", "")
    full = texts.get(40, "")
    bad = [n for n in range(1, 41) if not full.startswith(texts.get(n, "\0"))]
    check(r.returncode == 0 and not bad, "JSONL: the text of max_tokens N is a prefix of the text of 40",
          f"bad N: {bad}")


def test_http_bind():
    probe = run(["serve", "--http", "127.0.0.1:0", "-m", "/nonexistent.gguf"])
    if "no HTTP server" in probe.stderr:
        print("skip serve --http checks: no libmicrohttpd in this build", flush=True)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    return port, s


def test_http(model):
    got = test_http_bind()
    if not got:
        return
    port, s = got
    r = run(["serve", "--host", "127.0.0.1", "--port", str(port), "-m", model], timeout=60)
    s.close()
    check(r.returncode == 5 and f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Failed to bind" not in r.stderr,
          "serve --host/--port: a busy port is said once, in our words, with its number", r.stderr)
    check(all(ln.startswith("ridgekv serve:") for ln in r.stderr.splitlines() if ln),
          "every serve line on stderr is ours", r.stderr)


def test_pull_hint(tmp):
    # pull's "--prepare" hint only when the maps are not in the cache: the real cache's
    # default model (and its maps, when `ridgekv prepare` made them) linked into a new one
    home = os.environ.get("REAL_CACHE")
    mfile = os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf") if home else ""
    maps = [f for f in os.listdir(os.path.join(home, "maps"))] if home and os.path.isdir(os.path.join(home, "maps")) \
        else []
    if not os.path.exists(mfile) or not any(f.endswith(".maps.gguf") for f in maps):
        print("skip pull's hint: no default model with maps in the real cache", flush=True)
        return
    xdg = os.path.join(tmp, "pullcache")
    os.makedirs(os.path.join(xdg, "ridgekv"))
    os.symlink(mfile, os.path.join(xdg, "ridgekv", os.path.basename(mfile)))
    env = dict(os.environ, XDG_CACHE_HOME=xdg)
    r = run(["pull"], env=env)
    check(r.returncode == 0 and "--prepare" in r.stderr, "pull without cached maps suggests --prepare", r.stderr)
    os.symlink(os.path.join(home, "maps"), os.path.join(xdg, "ridgekv", "maps"))
    r = run(["pull"], env=env)
    check(r.returncode == 0 and "already present" in r.stderr and "--prepare" not in r.stderr,
          "pull with the maps in the cache says nothing of --prepare", r.stderr)


def test_quiet(model, doc, tmp):
    short = os.path.join(tmp, "short.txt")
    with open(short, "w") as f:
        f.write("Lily had a red ball.\n")
    base = ["ask", "-m", model, "-n", "2", "--temp", "0", "--no-cache", "--fill", "identity", "--split", "1",
            "--tail", "512"]
    r = run(base + ["--doc", short, "what?"])
    check(r.returncode == 0 and "RidgeFill" not in r.stderr and "ridgefill" not in r.stderr,
          "ask: no RidgeFill line for a prompt shorter than the tail", r.stderr)
    r = run(base + ["--doc", doc, "what?"])
    fill = [ln for ln in r.stderr.splitlines() if "RidgeFill" in ln]
    check(r.returncode == 0 and len(fill) == 1 and "RidgeFill identity for this" in fill[0] and len(fill[0]) < 200,
          "ask: one short RidgeFill line for a prompt longer than the tail", r.stderr)
    path = os.path.join(tmp, "conv.json")
    r = run(["chat", "-m", model, "-n", "2", "--temp", "0"], stdin=f"hello\n/save {path}\n")
    kv = os.path.getsize(path + ".kv") if os.path.exists(path + ".kv") else -1
    check(r.returncode == 0 and re.search(r"saved 2 messages to .*conv\.json \(\d+ B\) and the KV cache of \d+ "
                                          r"tokens to .*conv\.json\.kv \([\d.]+ KiB\)", r.stderr) and kv > 0,
          "chat /save says what it wrote and the sizes", r.stderr)


def main():
    if not BIN or not os.access(BIN, os.X_OK):
        print("SKIP: RK_BIN unset", flush=True)
        sys.exit(77)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/"), ".cache")
    os.environ["REAL_CACHE"] = os.path.join(xdg, "ridgekv")
    with tempfile.TemporaryDirectory(prefix="rkterm") as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # no document cache or maps of the real one
        model = os.path.join(tmp, "m.gguf")
        r = run(["synth", "--shape", "smollm2-135m", "--type", "q8_0", "--vocab", "320", "--layers", "2", "-o", model])
        if r.returncode != 0:
            print("synth failed: " + r.stderr, flush=True)
            sys.exit(1)
        doc = os.path.join(tmp, "doc.txt")
        with open(doc, "w") as f:
            f.write(words(120) + "\n")
        only = sys.argv[1:]
        for name, fn, args in [("ask_bar", test_ask_bar, (model, doc)), ("resize", test_resize, (model, doc)),
                               ("chat_bar", test_chat_bar, (model, tmp)),
                               ("ctrl_c", test_ctrl_c, (model, doc)), ("habits", test_habits, (model,)),
                               ("utf8_cut", test_utf8_cut, (model,)), ("http", test_http, (model,)),
                               ("quiet", test_quiet, (model, doc, tmp)), ("pull_hint", test_pull_hint, (tmp,))]:
            if not only or name in only:
                print(f"-- {name}", flush=True)
                fn(*args)
    if FAILS:
        print(f"{len(FAILS)} failed: " + "; ".join(FAILS), flush=True)
        sys.exit(1)
    print("all passed", flush=True)


if __name__ == "__main__":
    main()
