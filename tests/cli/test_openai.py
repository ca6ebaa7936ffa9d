#!/usr/bin/env python3
"""OpenAI compatibility as clients use it, with the `openai` Python package against
`ridgekv serve --http` on the default model (SmolLM2-135M-Instruct): the model id, content
given as a list of text parts, a second system message, the 400s for image parts, tool
messages and `tools`, JSON answers under response_format json_object and json_schema
(json.loads and checked against the schema), unsupported schema keywords, a too-long
prompt with stream: true (BadRequestError before any chunk), another model's name (404),
the penalty fields; then `serve --jsonl` with response_format. Exit 77 = skipped (no
default model, no libmicrohttpd or no openai package: scripts/deps.sh installs it)."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("RK_BIN")
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def skip(why):
    print("SKIP: " + why, flush=True)
    sys.exit(77)


def default_model():
    env = os.environ.get("RIDGEKV_MODEL")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ridgekv", "SmolLM2-135M-Instruct.Q4_1.gguf")


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer"},
        "colour": {"enum": ["red", "green", "blue"]},
        "pets": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                    "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "colour", "address"],
    "additionalProperties": False,
}


def valid_person(v):
    """The schema above, checked by hand (no jsonschema package needed)."""
    if not isinstance(v, dict) or not set(v) <= set(PERSON["properties"]):
        return False
    if not all(k in v for k in PERSON["required"]):
        return False
    ok = isinstance(v["name"], str) and 1 <= len(v["name"]) <= 24
    ok = ok and isinstance(v["age"], int) and not isinstance(v["age"], bool)
    ok = ok and v["colour"] in ("red", "green", "blue")
    if "pets" in v:
        ok = ok and isinstance(v["pets"], list) and len(v["pets"]) <= 3
        ok = ok and all(isinstance(p, str) and len(p) <= 12 for p in v["pets"])
    a = v["address"]
    return ok and isinstance(a, dict) and set(a) == {"city"} and isinstance(a["city"], str) and len(a["city"]) <= 24


def main():
    model = default_model()
    if not BIN or not os.path.exists(model):
        skip(f"RK_BIN unset or the default model {model} is missing (ridgekv pull)")
    probe = subprocess.run([BIN, "serve", "--http", "127.0.0.1:0", "-m", "/nonexistent.gguf"], capture_output=True,
                           text=True, timeout=30)
    if "no HTTP server" in probe.stderr:
        skip("this build has no libmicrohttpd (apt-get install libmicrohttpd-dev)")
    try:
        import openai  # noqa: F401
    except ImportError:
        skip("the openai package is not installed (scripts/deps.sh installs it: python3 -m pip install --user openai)")

    errf = tempfile.NamedTemporaryFile(prefix="rkopenai-", suffix=".err", delete=False)
    srv = subprocess.Popen([BIN, "serve", "--http", "127.0.0.1:0", "--seed", "1", "-v"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=errf)
    port = None
    t_end = time.time() + 60
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
        run_openai(port)
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = -1
        check(rc == 0, f"SIGTERM ends the server with exit 0 (got {rc})")
        log = open(errf.name).read()
        os.unlink(errf.name)
        check(not re.search(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:", log),
              "no sanitizer report from the server")
    run_jsonl()
    if FAILS:
        print("server log:\n" + log)
    return 1 if FAILS else 0


def expect_error(cls, what, needle, fn):
    import openai
    try:
        fn()
        check(False, f"{what}: raises {cls.__name__}")
    except cls as e:
        check(needle in str(e), f"{what}: {cls.__name__} naming {needle!r}: {e}")
    except openai.APIError as e:
        check(False, f"{what}: {cls.__name__} expected, got {type(e).__name__}: {e}")


def run_openai(port):
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120, max_retries=0)
    mid = client.models.list().data[0].id
    check(mid == "smollm2-135m", f"the model id is the catalogue name: {mid!r}")
    chat = client.chat.completions.create

    q = "What is the capital of France? Answer in one word."
    plain = chat(model=mid, messages=[{"role": "user", "content": q}], max_tokens=12, temperature=0)
    check(plain.model == "smollm2-135m", f"responses carry the model id: {plain.model!r}")
    parts = chat(model=mid, messages=[{"role": "user", "content": [{"type": "text", "text": q[:20]},
                                                                   {"type": "text", "text": q[20:]}]}],
                 max_tokens=12, temperature=0)
    check(parts.choices[0].message.content == plain.choices[0].message.content,
          f"text parts read as their joined text: {parts.choices[0].message.content!r} vs "
          f"{plain.choices[0].message.content!r}")
    two_sys = chat(model=mid, messages=[{"role": "system", "content": "You are terse."},
                                        {"role": "user", "content": q},
                                        {"role": "system", "content": "Answer in English."}],
                   max_tokens=8, temperature=0)
    check(two_sys.choices[0].finish_reason in ("stop", "length"), "a second system message is accepted")
    expect_error(openai.BadRequestError, "an image part", "image_url",
                 lambda: chat(model=mid, max_tokens=4, messages=[{"role": "user", "content": [
                     {"type": "text", "text": "what is this?"},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]))
    expect_error(openai.BadRequestError, "a tool message", "tool",
                 lambda: chat(model=mid, max_tokens=4, messages=[
                     {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "42"}]))
    expect_error(openai.BadRequestError, "tools", "'tools'",
                 lambda: chat(model=mid, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                              tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]))
    expect_error(openai.NotFoundError, "another model", "gpt-4o",
                 lambda: chat(model="gpt-4o", max_tokens=4, messages=[{"role": "user", "content": "hi"}]))

    # JSON answers
    r = chat(model=mid, messages=[{"role": "user", "content": "Describe a cat as a JSON object with name and age."}],
             max_tokens=160, temperature=0, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    try:
        v = json.loads(text)
    except ValueError:
        v = None
    check(isinstance(v, dict) and r.choices[0].finish_reason == "stop",
          f"json_object: json.loads gives an object, finish_reason stop: {text!r} {r.choices[0].finish_reason}")
    for seed, temp in ((0, 0), (3, 0.8), (4, 1.2)):
        r = chat(model=mid, messages=[{"role": "user", "content": "Make up a person and describe them as JSON."}],
                 max_tokens=200, temperature=temp, seed=seed,
                 response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        text = r.choices[0].message.content
        try:
            v = json.loads(text)
        except ValueError:
            v = None
        check(v is not None and valid_person(v) and r.choices[0].finish_reason == "stop",
              f"json_schema at temperature {temp}: valid against the schema: {text!r}")
    parts = []
    for ch in chat(model=mid, messages=[{"role": "user", "content": "A person as JSON."}], max_tokens=200,
                   temperature=0, stream=True,
                   response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
    try:
        check(valid_person(json.loads("".join(parts))), f"json_schema streamed: {''.join(parts)!r}")
    except ValueError:
        check(False, f"json_schema streamed: {''.join(parts)!r}")
    expect_error(openai.BadRequestError, "an unsupported schema keyword", "'pattern'",
                 lambda: chat(model=mid, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                              response_format={"type": "json_schema", "json_schema": {
                                  "name": "x", "schema": {"type": "string", "pattern": "^a"}}}))

    # the penalty fields (OpenAI's and llama.cpp's names)
    r = chat(model=mid, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0,
             frequency_penalty=0.5, presence_penalty=0.5,
             extra_body={"repeat_penalty": 1.1, "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2})
    check(len(r.choices[0].message.content) > 0, "frequency / presence / repeat / DRY fields are accepted")
    expect_error(openai.BadRequestError, "a penalty out of range", "frequency_penalty",
                 lambda: chat(model=mid, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                              frequency_penalty=3))

    # a prompt past the context: 400 before the stream starts, streamed or not
    long_msgs = [{"role": "user", "content": "word " * 9000}]
    expect_error(openai.BadRequestError, "too long, streamed", "context",
                 lambda: list(chat(model=mid, messages=long_msgs, max_tokens=4, stream=True)))
    expect_error(openai.BadRequestError, "too long", "context",
                 lambda: chat(model=mid, messages=long_msgs, max_tokens=4))
    c = client.completions.create(model=mid, prompt="The capital of France is", max_tokens=4, temperature=0)
    check(c.model == "smollm2-135m" and len(c.choices[0].text) > 0, f"completions: {c.choices[0].text!r}")


def run_jsonl():
    req = {"id": 1, "op": "chat", "messages": [{"role": "user", "content": "A person as JSON."}], "max_tokens": 200,
           "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}
    bad = {"id": 2, "op": "chat", "messages": [{"role": "user", "content": "hi"}],
           "response_format": {"type": "json_schema", "json_schema": {"schema": {"anyOf": []}}}}
    lines = json.dumps(req) + "\n" + json.dumps(bad) + "\n"
    out = subprocess.run([BIN, "serve", "--jsonl", "--seed", "1"], input=lines, capture_output=True, text=True,
                         timeout=300).stdout
    ev = [json.loads(line) for line in out.splitlines() if line.strip()]
    done = [e for e in ev if e.get("id") == 1 and e.get("event") == "done"]
    text = "".join(e["text"] for e in ev if e.get("id") == 1 and e.get("event") in ("token", "done") and "text" in e)
    try:
        ok = bool(done) and valid_person(json.loads(text)) and done[0]["finish_reason"] == "eog"
    except (ValueError, KeyError):
        ok = False
    check(ok, f"jsonl: response_format json_schema gives valid JSON: {text!r} {done}")
    err = [e for e in ev if e.get("id") == 2 and e.get("event") == "error"]
    check(bool(err) and err[0]["code"] == "invalid_request" and "'anyOf'" in err[0]["message"],
          f"jsonl: an unsupported keyword is an invalid_request naming it: {err}")


if __name__ == "__main__":
    sys.exit(main())
