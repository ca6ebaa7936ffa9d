#!/usr/bin/env python3
"""ridgekv serve --http end to end, on 127.0.0.1 only, bounded in time: curl (health,
models, chat and completions with and without SSE streaming, malformed JSON, a huge body,
wrong paths and methods), a client that disconnects mid-stream, then the real `openai`
Python client from PyPI (installed into a temporary folder when absent; that part is
skipped with a message when PyPI cannot be reached). Exit 77 = skipped (meson)."""
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
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def skip(why):
    print("SKIP: " + why, flush=True)
    sys.exit(77)


def curl(port, path, body=None, data_file=None, method=None, timeout=30):
    cmd = ["curl", "-sS", "-N", "--max-time", str(timeout), "-w", "\n%{http_code}", f"http://127.0.0.1:{port}{path}"]
    if method:
        cmd += ["-X", method]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", body]
    if data_file:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@" + data_file]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 10).stdout
    text, _, code = out.rpartition("\n")
    return int(code or 0), text


def sse_events(text):
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def main():
    if not BIN or not os.path.exists(MODEL):
        skip("RK_BIN unset or ../shared stories260K model missing")
    probe = subprocess.run([BIN, "serve", "--http", "127.0.0.1:0", "-m", "/nonexistent.gguf"], capture_output=True,
                           text=True, timeout=30)
    if "no HTTP server" in probe.stderr:
        skip("this build has no libmicrohttpd (apt-get install libmicrohttpd-dev)")
    if subprocess.run(["which", "curl"], capture_output=True).returncode != 0:
        skip("curl is not installed")

    errf = tempfile.NamedTemporaryFile(prefix="rkhttp-", suffix=".err", delete=False)
    srv = subprocess.Popen([BIN, "serve", "--http", "127.0.0.1:0", "-m", MODEL, "-v", "--seed", "1"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf)
    port = None
    t_end = time.time() + 30
    while time.time() < t_end and port is None:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(errf.name).read())
        if m:
            port = int(m.group(1))
        elif srv.poll() is not None:
            break
        time.sleep(0.05)
    if port is None:
        srv.kill()
        print(open(errf.name).read())
        check(False, "the server starts and prints its port")
        return 1
    try:
        run_curl(port)
        run_queue(port)
        run_disconnect(port)
        run_openai(port)
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = -1
        check(rc == 0, f"SIGTERM ends the server with exit 0 (got {rc})")
        log = open(errf.name).read()
        os.unlink(errf.name)
        check("the client went away" in log, "the server saw the client that disconnected")
        # under the sanitizer build the server's own reports land in its log, not the test's stderr
        check(not re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:", log),
              "no sanitizer report from the server")
    if FAILS:
        print("server log:\n" + log)
    return 1 if FAILS else 0


def run_curl(port):
    code, text = curl(port, "/health")
    check(code == 200 and json.loads(text) == {"status": "ok"}, f"/health: {code} {text}")
    code, text = curl(port, "/v1/models")
    models = json.loads(text)
    check(code == 200 and models["object"] == "list" and len(models["data"]) == 1, f"/v1/models: {text}")
    chat = {"messages": [{"role": "system", "content": "You tell stories."},
                         {"role": "user", "content": "Once upon a time"}], "max_tokens": 24, "temperature": 0}
    code, text = curl(port, "/v1/chat/completions", json.dumps(chat))
    check(code == 200, f"chat: {code} {text}")
    r = json.loads(text)
    full = r["choices"][0]["message"]["content"]
    check(r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant" and len(full) > 0,
          f"chat completion shape: {text}")
    check(r["usage"]["completion_tokens"] == 24 and r["choices"][0]["finish_reason"] == "length",
          f"24 tokens, finish_reason length: {r['usage']} {r['choices'][0]['finish_reason']}")
    # the same request streamed: chunks that add up to the same text, then [DONE]
    code, text = curl(port, "/v1/chat/completions", json.dumps(dict(chat, stream=True)))
    ev = sse_events(text)
    check(code == 200 and ev and ev[-1] == "[DONE]", f"SSE ends with [DONE]: {text[-200:]}")
    chunks = [json.loads(e) for e in ev[:-1]]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    check(streamed == full, f"streamed text equals the whole answer: {streamed!r} vs {full!r}")
    check(all(c["object"] == "chat.completion.chunk" for c in chunks), "chunk objects")
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "the first chunk names the role")
    check(chunks[-1]["choices"][0]["finish_reason"] == "length", "the last chunk has the finish_reason")
    # completions, with a stop string
    comp = {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}
    code, text = curl(port, "/v1/completions", json.dumps(comp))
    r = json.loads(text)
    ctext = r["choices"][0]["text"]
    check(code == 200 and r["object"] == "text_completion" and len(ctext) > 10, f"completion: {text}")
    stop = ctext[len(ctext) // 2:len(ctext) // 2 + 4]
    code, text = curl(port, "/v1/completions", json.dumps(dict(comp, stop=[stop])))
    r = json.loads(text)
    check(r["choices"][0]["text"] == ctext[:ctext.index(stop)] and r["choices"][0]["finish_reason"] == "stop",
          f"stop {stop!r}: {r['choices'][0]}")
    code, text = curl(port, "/v1/completions", json.dumps(dict(comp, stream=True)))
    ev = sse_events(text)
    streamed = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1])
    check(code == 200 and ev[-1] == "[DONE]" and streamed == ctext, f"streamed completion: {streamed!r}")
    # bad requests: clear errors, the server keeps going
    code, text = curl(port, "/v1/chat/completions", '{"messages": [')
    check(code == 400 and "not one JSON value" in json.loads(text)["error"]["message"], f"malformed JSON: {code} {text}")
    code, text = curl(port, "/v1/chat/completions", '{"messages": "hi"}')
    check(code == 400 and "messages" in text, f"messages not an array: {code} {text}")
    code, text = curl(port, "/v1/chat/completions",
                      json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
                                  "max_tokens": 2}))
    check(code == 200, f"a system message after the first is joined to the first: {code} {text[:200]}")
    code, text = curl(port, "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}))
    check(code == 400 and "max_tokens" in text, f"max_tokens 0: {code} {text}")
    code, text = curl(port, "/v1/completions", json.dumps({"prompt": "word " * 600, "max_tokens": 4}))
    check(code == 400 and "context" in text, f"prompt past the context: {code} {text[:200]}")
    big = tempfile.NamedTemporaryFile(prefix="rkhttp-big-", delete=False)
    big.write(b'{"prompt": "' + b"a" * (3 << 20) + b'"}')
    big.close()
    code, text = curl(port, "/v1/completions", data_file=big.name)
    os.unlink(big.name)
    check(code == 413 and "larger than" in text, f"3 MiB body: {code} {text}")
    code, text = curl(port, "/v1/nothing")
    check(code == 404, f"unknown path: {code}")
    code, text = curl(port, "/v1/chat/completions", method="GET")
    check(code == 405, f"GET on chat: {code}")
    code, text = curl(port, "/health")
    check(code == 200, "still healthy after the bad requests")


def run_queue(port):
    """Requests at the same time wait in line (concurrency 1): all are answered, in full."""
    import threading
    out = [None] * 3

    def one(i):
        out[i] = curl(port, "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 12,
                                                            "temperature": 0}), timeout=120)
    th = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    texts = [json.loads(t)["choices"][0]["text"] if c == 200 else None for c, t in out]
    check(all(c == 200 for c, _ in out) and len(set(texts)) == 1,
          f"3 requests at once: all 200 with the same greedy text: {[c for c, _ in out]} {texts}")


def run_disconnect(port):
    """A streaming client that reads the first event and hangs up; the generation stops and
    the next request is served at once (it would wait behind a runaway generation)."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 100000, "stream": True, "temperature": 1.0})
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    got = b""
    t_end = time.time() + 20
    while b"data: " not in got and time.time() < t_end:
        got += s.recv(4096)
    check(b"data: " in got, "the stream started")
    s.close()
    t0 = time.time()
    code, _ = curl(port, "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2}), timeout=60)
    check(code == 200, f"the next request is served after the disconnect ({time.time() - t0:.1f} s)")


def run_openai(port):
    try:
        import openai  # noqa: F401
    except ImportError:
        target = os.path.join(tempfile.gettempdir(), f"ridgekv-openai-{os.getuid()}")
        if not os.path.isdir(os.path.join(target, "openai")):
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--timeout", "20", "--retries", "1",
                                "--target", target, "openai"],
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                print("SKIP (openai client): pip install openai failed (no network?): " + r.stderr[-300:])
                return
        sys.path.insert(0, target)
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60, max_retries=0)
    models = client.models.list()
    check(len(models.data) == 1, f"openai: models.list: {models}")
    msgs = [{"role": "user", "content": "Once upon a time"}]
    r = client.chat.completions.create(model=models.data[0].id, messages=msgs, max_tokens=16, temperature=0)
    text = r.choices[0].message.content
    check(r.choices[0].message.role == "assistant" and len(text) > 0 and r.usage.completion_tokens == 16,
          f"openai: chat.completions.create: {r}")
    parts = []
    for chunk in client.chat.completions.create(model=models.data[0].id, messages=msgs, max_tokens=16,
                                                temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    check("".join(parts) == text, f"openai: streamed chat equals the whole answer: {''.join(parts)!r} vs {text!r}")
    c = client.completions.create(model=models.data[0].id, prompt="Once upon a time", max_tokens=8, temperature=0)
    check(len(c.choices[0].text) > 0 and c.usage.completion_tokens == 8, f"openai: completions.create: {c}")
    try:
        client.chat.completions.create(model="x", messages=[], max_tokens=4)
        check(False, "openai: empty messages is an error")
    except openai.BadRequestError as e:
        check("messages" in str(e), f"openai: BadRequestError for empty messages: {e}")


if __name__ == "__main__":
    sys.exit(main())
