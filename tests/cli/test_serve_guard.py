#!/usr/bin/env python3
"""The servers' defences, end to end on 127.0.0.1 (docs/HTTP.md, "Security model"):
idle and half-open connections do not lock clients out and are shed; the body type, Host,
Origin (and the CORS preflight) and API key checks; a non-streamed answer stops when its
client leaves; the one text and seed rule of HTTP and JSONL (NUL, bad UTF-8, seed past
2^63 - 1); paths that are not regular files (FIFO as -m, --doc, --ridgefill and a request's
"ridgefill") fail at once; a client-named file's bytes never come back; a 2 GiB sparse
document is refused from its size. Exit 77 = skipped (meson)."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("RK_BIN")
SHARED = os.environ.get("RK_SHARED_DIR", "")
MODEL = os.path.join(SHARED, "models/stories260K/stories260K-f32.gguf")
KEY = "rk-test-key-123"
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def skip(why):
    print("SKIP: " + why, flush=True)
    sys.exit(77)


def start_http(args, env_extra=None):
    errf = tempfile.NamedTemporaryFile(prefix="rkguard-", suffix=".err", delete=False)
    env = dict(os.environ, **(env_extra or {}))
    srv = subprocess.Popen([BIN, "serve", "--http", "127.0.0.1:0", "-v", "--seed", "1"] + args,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf, env=env)
    t_end = time.time() + 120
    while time.time() < t_end:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(errf.name).read())
        if m:
            return srv, int(m.group(1)), errf.name
        if srv.poll() is not None:
            break
        time.sleep(0.05)
    srv.kill()
    return None, None, errf.name


def stop_http(srv, log_path):
    srv.send_signal(signal.SIGTERM)
    try:
        rc = srv.wait(timeout=60)
    except subprocess.TimeoutExpired:
        srv.kill()
        rc = -1
    check(rc == 0, f"SIGTERM ends the server with exit 0 (got {rc})")
    log = open(log_path).read()
    os.unlink(log_path)
    check(not re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:", log),
          "no sanitizer report from the server")
    return log


def req(port, method, path, body=None, headers=None, timeout=30):
    """(status, response headers as a dict of lower-case names, parsed JSON or text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Host": f"127.0.0.1:{port}"}
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    try:
        return r.status, hdrs, json.loads(data)
    except ValueError:
        return r.status, hdrs, data


def post(port, obj, headers=None, path="/v1/completions", raw=None, timeout=30):
    h = {"Content-Type": "application/json", "Authorization": "Bearer " + KEY}
    h.update(headers or {})
    h = {k: v for k, v in h.items() if v is not None}
    return req(port, "POST", path, raw if raw is not None else json.dumps(obj).encode(), h, timeout)


def err_of(body):
    return body.get("error", {}) if isinstance(body, dict) else {}


def run_admission(port):
    """70 half-open connections (a request line and part of the headers, then nothing), and
    a normal request is still answered at once; an idle connection is closed in seconds."""
    socks = []
    for _ in range(70):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        except OSError:
            break
    check(len(socks) == 70, f"70 half-open connections opened ({len(socks)})")
    time.sleep(0.5)
    t0 = time.time()
    try:
        code, _, body = post(port, {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}, timeout=20)
    except OSError as e:
        code, body = 0, str(e)
    dt = time.time() - t0
    check(code == 200 and dt < 5, f"a request among 70 half-open connections: {code} in {dt:.2f} s")
    for s in socks:
        s.close()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /health HTTP/1.1\r\n")  # headers never finished
    t0 = time.time()
    try:
        gone = s.recv(100) == b""
    except OSError:
        gone = True
    dt = time.time() - t0
    s.close()
    check(gone and dt < 16, f"a connection whose headers never end is closed ({dt:.1f} s)")


def run_checks(port):
    ok = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    code, _, body = post(port, ok)
    check(code == 200 and body["usage"]["completion_tokens"] == 4, f"the right key: {code}")
    code, _, body = post(port, ok, {"Authorization": None})
    check(code == 401 and err_of(body).get("code") == "invalid_api_key", f"no key: {code} {body}")
    code, _, body = post(port, ok, {"Authorization": "Bearer wrong-key-1234567"})
    check(code == 401 and err_of(body).get("code") == "invalid_api_key", f"a wrong key: {code} {body}")
    code, _, body = req(port, "GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})
    check(code == 200, f"/v1/models with the key: {code}")
    code, _, _ = req(port, "GET", "/v1/models")
    check(code == 401, f"/v1/models without the key: {code}")
    code, _, _ = req(port, "GET", "/health")
    check(code == 200, f"/health needs no key: {code}")
    # a cross-site "simple" request: text/plain, or no type at all
    code, _, body = post(port, ok, {"Content-Type": "text/plain"})
    check(code == 415 and "application/json" in err_of(body).get("message", ""), f"text/plain: {code} {body}")
    code, _, _ = post(port, ok, {"Content-Type": "application/x-www-form-urlencoded"})
    check(code == 415, f"a form body: {code}")
    code, _, _ = post(port, ok, {"Content-Type": "application/json; charset=utf-8"})
    check(code == 200, f"application/json with a charset: {code}")
    # DNS rebinding: a foreign name for this address
    code, _, body = post(port, ok, {"Host": f"attacker.example:{port}"})
    check(code == 403 and "--allow-host" in err_of(body).get("message", ""), f"a foreign Host: {code} {body}")
    code, _, _ = post(port, ok, {"Host": f"127.0.0.1:{port + 1 if port < 65535 else port - 1}"})
    check(code == 403, f"another port in Host: {code}")
    for host in (f"localhost:{port}", f"[::1]:{port}", f"models.lan:{port}"):
        code, _, _ = post(port, ok, {"Host": host})
        check(code == 200, f"Host {host}: {code}")
    # browsers: a foreign Origin is refused, an allowed one gets CORS headers and a preflight
    code, _, body = post(port, ok, {"Origin": "http://evil.example"})
    check(code == 403 and "--allow-origin" in err_of(body).get("message", ""), f"a foreign Origin: {code}")
    code, h, _ = post(port, ok, {"Origin": "https://app.example:8443"})
    check(code == 200 and h.get("access-control-allow-origin") == "https://app.example:8443",
          f"an allowed Origin: {code} {h.get('access-control-allow-origin')}")
    code, h, _ = req(port, "OPTIONS", "/v1/chat/completions",
                     headers={"Origin": "https://app.example:8443", "Access-Control-Request-Method": "POST",
                              "Access-Control-Request-Headers": "authorization, content-type"})
    check(code == 204 and "POST" in h.get("access-control-allow-methods", "") and
          "authorization" in h.get("access-control-allow-headers", "").lower() and
          h.get("access-control-allow-origin") == "https://app.example:8443", f"preflight: {code} {h}")
    code, _, _ = req(port, "OPTIONS", "/v1/chat/completions",
                     headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    check(code == 403, f"preflight from a foreign origin: {code}")
    # the text and seed rule (the same as JSONL's)
    code, _, body = post(port, {"prompt": "a\u0000b", "max_tokens": 2})
    check(code == 400 and "NUL" in err_of(body).get("message", ""), f"NUL in a prompt: {code} {body}")
    code, _, body = post(port, {"messages": [{"role": "user", "content": "x\u0000"}], "max_tokens": 2},
                         path="/v1/chat/completions")
    check(code == 400 and "NUL" in err_of(body).get("message", ""), f"NUL in a message: {code} {body}")
    code, _, body = post(port, None, raw=b'{"prompt": "a\xff\xfeb", "max_tokens": 2}')
    check(code == 400 and "UTF-8" in err_of(body).get("message", ""), f"bad UTF-8 in a prompt: {code} {body}")
    for seed in ("18446744073709551616", "-1", "1.5", "9223372036854775808"):
        code, _, body = post(port, None, raw=b'{"prompt": "a", "max_tokens": 2, "seed": ' + seed.encode() + b"}")
        check(code == 400 and "seed" in err_of(body).get("message", ""), f"seed {seed}: {code} {body}")
    code, _, _ = post(port, {"prompt": "a", "max_tokens": 2, "seed": 9223372036854775807})
    check(code == 200, f"seed 2^63 - 1: {code}")


def run_cancel():
    """A non-streamed request whose client leaves stops generating (the default model counts
    for a long time at temperature 0)."""
    srv, port, log_path = start_http(["-c", "4096", "-t", "2", "--no-ridgefill"])
    if srv is None:
        log = open(log_path).read()
        os.unlink(log_path)
        if "model" in log and ("pull" in log or "not found" in log or "No such file" in log):
            print("SKIP (cancel part): no default model: " + log[-300:])
            return
        check(False, "the default-model server starts: " + log[-500:])
        return
    n_max = 3000
    body = json.dumps({"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": n_max, "temperature": 0})
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    time.sleep(2.0)
    s.close()
    t0 = time.time()
    code, _, _ = req(port, "POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2}).encode(),
                     {"Content-Type": "application/json"}, timeout=120)
    dt = time.time() - t0
    check(code == 200, f"the next request is answered after the client left ({dt:.1f} s)")
    log = stop_http(srv, log_path)
    m = re.search(r"cmpl-1 done: \d+ prompt tokens, (\d+) generated \(cancelled\); the client went away", log)
    check(m is not None and int(m.group(1)) < n_max // 2,
          f"the left request stopped early: {m.group(0) if m else log[-600:]}")
    check("1 answers cancelled" in log, "the cancel counter says 1")


def run_jsonl(fifo):
    lines = [
        json.dumps({"id": 1, "op": "complete", "prompt": "a\u0000b", "max_tokens": 2}),
        b'{"id": 2, "op": "complete", "prompt": "a", "max_tokens": 2, "seed": 18446744073709551616}'.decode(),
        json.dumps({"id": 3, "op": "complete", "prompt": "a", "max_tokens": 2, "ridgefill": fifo}),
        json.dumps({"id": 4, "op": "complete", "prompt": "a", "max_tokens": 2, "ridgefill": "/etc/passwd"}),
        json.dumps({"id": 5, "op": "chat", "messages": [{"role": "user", "content": "\u0000"}], "max_tokens": 2}),
        json.dumps({"id": 6, "op": "complete", "prompt": "Once", "max_tokens": 2, "seed": 7}),
        json.dumps({"id": 7, "op": "complete", "prompt": "a", "max_tokens": 2, "kv": "lowram:pred=/etc/passwd"}),
        json.dumps({"id": 8, "op": "complete", "prompt": "a", "max_tokens": 2, "kv": "lowram:pred=" + fifo}),
    ]
    t0 = time.time()
    r = subprocess.run([BIN, "serve", "--jsonl", "-m", MODEL], input="\n".join(lines) + "\n", capture_output=True,
                       text=True, timeout=60)
    dt = time.time() - t0
    ev = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    last = {e["id"]: e for e in ev}
    check(r.returncode == 0 and dt < 20, f"serve --jsonl answers every line ({dt:.1f} s, rc {r.returncode})")
    check(last.get(1, {}).get("event") == "error" and "NUL" in last[1].get("message", ""), f"JSONL NUL: {last.get(1)}")
    check(last.get(2, {}).get("event") == "error" and "seed" in last[2].get("message", ""),
          f"JSONL seed 2^64: {last.get(2)}")
    check(last.get(3, {}).get("event") == "error" and "FIFO" in last[3].get("message", ""),
          f"JSONL ridgefill FIFO: {last.get(3)}")
    m4 = last.get(4, {}).get("message", "")
    check(last.get(4, {}).get("event") == "error" and "not a RidgeFill map" in m4 and "root" not in m4 and
          "72 6f" not in m4, f"JSONL ridgefill /etc/passwd names no byte of it: {m4}")
    check(last.get(5, {}).get("event") == "error" and "NUL" in last[5].get("message", ""),
          f"JSONL NUL in a message: {last.get(5)}")
    check(last.get(6, {}).get("event") == "done", f"a good line after them: {last.get(6)}")
    m7 = last.get(7, {}).get("message", "")
    check(last.get(7, {}).get("event") == "error" and "not a LowRAM predictor" in m7 and "root" not in m7 and
          "72 6f" not in m7, f"JSONL kv pred=/etc/passwd names no byte of it: {m7}")
    check(last.get(8, {}).get("event") == "error" and "FIFO" in last[8].get("message", ""),
          f"JSONL kv pred=FIFO: {last.get(8)}")


def run_paths(fifo, tmp):
    sparse = os.path.join(tmp, "sparse.txt")
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)
    cases = [
        ("-m FIFO", [BIN, "run", "-m", fifo, "-p", "hi", "-n", "2"], "FIFO"),
        ("--ridgefill FIFO", [BIN, "run", "-m", MODEL, "--ridgefill", fifo, "-p", "hi", "-n", "2"], "FIFO"),
        ("--doc FIFO", [BIN, "ask", "-m", MODEL, "--doc", fifo, "what?"], "FIFO"),
        ("-f FIFO", [BIN, "run", "-m", MODEL, "-f", fifo, "-n", "2"], "FIFO"),
        ("--doc a 2 GiB sparse file", [BIN, "ask", "-m", MODEL, "--doc", sparse, "what?"], "bytes"),
    ]
    for what, cmd, word in cases:
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
            rc, err = r.returncode, r.stderr
        except subprocess.TimeoutExpired:
            rc, err = None, "timed out"
        dt = time.time() - t0
        check(rc not in (0, None) and word in err and dt < 5, f"{what}: refused in {dt:.2f} s: {err.strip()[-200:]}")
    os.unlink(sparse)


def main():
    if not BIN or not os.path.exists(MODEL):
        skip("RK_BIN unset or ../shared stories260K model missing")
    tmp = tempfile.mkdtemp(prefix="rkguard-")
    fifo = os.path.join(tmp, "pipe")
    os.mkfifo(fifo)
    try:
        run_paths(fifo, tmp)
        run_jsonl(fifo)
        probe = subprocess.run([BIN, "serve", "--http", "127.0.0.1:0", "-m", "/nonexistent.gguf"],
                               capture_output=True, text=True, timeout=30)
        if "no HTTP server" in probe.stderr:
            print("SKIP (HTTP part): this build has no libmicrohttpd")
        else:
            srv, port, log_path = start_http(["-m", MODEL, "--allow-origin", "https://app.example:8443",
                                              "--allow-host", "models.lan"], {"RIDGEKV_API_KEY": KEY})
            check(srv is not None, "the server starts and prints its port")
            if srv is not None:
                try:
                    run_admission(port)
                    run_checks(port)
                finally:
                    log = stop_http(srv, log_path)
                check("API key required" in log, "the start line says a key is required")
            run_cancel()
    finally:
        os.unlink(fifo)
        os.rmdir(tmp)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
