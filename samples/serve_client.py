#!/usr/bin/env python3
"""A small client for `ridgekv serve --jsonl` (Python 3 standard library only).

It starts the server as a subprocess, sends requests one JSON object per line and reads
the events back, printing streamed tokens as they arrive. See docs/JSONL.md.

    samples/serve_client.py "Why is the sky blue?"
    samples/serve_client.py --bin build/cli/ridgekv -m model.gguf --doc notes.txt "When is the meeting?"
"""
import argparse
import itertools
import json
import os
import subprocess
import sys


class ServeError(Exception):
    def __init__(self, event):
        super().__init__(f"{event['code']}: {event['message']}")
        self.code = event["code"]
        self.event = event


class Ridgekv:
    """One server process; requests run one after another (the server is sequential)."""

    def __init__(self, binary, *server_args):
        self.proc = subprocess.Popen(
            [binary, "serve", "--jsonl", *server_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # stderr (logs) passes through
            encoding="utf-8", bufsize=1)
        self.ids = itertools.count(1)

    def events(self, op, **fields):
        """Sends one request; yields its events up to and including the terminal one
        (`done` or `error`)."""
        rid = next(self.ids)
        self.proc.stdin.write(json.dumps({"id": rid, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            ev = json.loads(line)
            if ev["id"] != rid:  # cannot happen with one request in flight
                raise RuntimeError(f"event for id {ev['id']!r} while waiting for {rid}")
            yield ev
            if ev["event"] in ("done", "error"):
                return
        raise RuntimeError(f"the server exited (status {self.proc.wait()})")

    def call(self, op, **fields):
        """Runs a request to the end: (text, done event, other events). Raises ServeError."""
        text, extra = [], []
        for ev in self.events(op, **fields):
            if ev["event"] == "error":
                raise ServeError(ev)
            if ev["event"] == "token":
                text.append(ev["text"])
            elif ev["event"] == "done":
                text.append(ev.get("text", ""))  # without streaming, or held-back tail
                return "".join(text), ev, extra
            else:
                extra.append(ev)

    def stream(self, op, out=sys.stdout, **fields):
        """Prints the text as it comes; returns the done event. Raises ServeError."""
        for ev in self.events(op, **fields):
            if ev["event"] == "error":
                raise ServeError(ev)
            if ev["event"] == "token":
                out.write(ev["text"])
                out.flush()
            elif ev["event"] == "done":
                out.write(ev.get("text", "") + "\n")
                return ev

    def close(self):
        self.proc.stdin.close()  # EOF: the server finishes and exits 0
        return self.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("question", nargs="?", default="Write one sentence about the sea.")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bin", default=os.environ.get("RIDGEKV", os.path.join(here, "..", "build", "cli", "ridgekv")))
    ap.add_argument("-m", "--model", help="GGUF model (default: the server's default model)")
    ap.add_argument("--doc", action="append", default=[], help="ask about this text file (repeatable)")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    args = ap.parse_args()

    server_args = ["-m", args.model] if args.model else []
    rk = Ridgekv(args.bin, *server_args)
    try:
        _, _, info = rk.call("info")
        i = info[0]
        print(f"# {i['name']}: {i['arch']}, {i['n_layer']} layers, ctx {i['n_ctx']}, "
              f"template {i['chat_template']}", file=sys.stderr)

        gen = {"temperature": args.temp, "max_tokens": args.max_tokens}
        if args.doc:
            docs = []
            for path in args.doc:
                with open(path, encoding="utf-8") as f:
                    docs.append({"name": os.path.basename(path), "text": f.read()})
            done = rk.stream("ask", docs=docs, question=args.question, **gen)
        else:
            done = rk.stream("chat", messages=[{"role": "user", "content": args.question}], **gen)
        u = done["usage"]
        print(f"# {done['finish_reason']}: {u['prompt_tokens']} prompt + {u['completion_tokens']} generated "
              f"tokens, TTFT {done['ttft_ms']} ms, {done['decode_tok_s']} tok/s", file=sys.stderr)

        _, _, toks = rk.call("tokenize", text=args.question, pieces=True)
        print(f"# the question is {len(toks[0]['tokens'])} tokens: {toks[0]['pieces']}", file=sys.stderr)

        try:  # a bad request: one error event, and the server carries on
            rk.call("complete", prompt=42)
        except ServeError as e:
            print(f"# error as expected: {e}", file=sys.stderr)
    finally:
        status = rk.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
