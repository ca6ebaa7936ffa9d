#!/usr/bin/env python3
"""Paired fact questions over long documents: each arm (a set of `ridgekv serve --jsonl` flags)
answers the same questions about the same documents, so arms are compared question by
question (McNemar's exact test on the discordant pairs), never by averages alone.

A document is a stretch of a public-domain book from ../shared/corpus (several books, random
offsets) with K facts written into it at spread depths. Facts come from several templates
(5- and 6-digit codes, names, amounts, weekdays, places), each with its own wording of the
question, so that one wording's luck does not decide the result. All questions of a document
go to one server in a row: the document is read once (the document cache) and each question
after the first is a follow-up.

    scripts/qa_pairs.py -m MODEL --tokens 8000 --docs 10 --facts 20 \\
        --arm exact="--fill off --kv f16" --arm default="" --out results.jsonl

Prints one line per arm (right/total) and, for each arm against the first, the paired table
(b: the first right and this one wrong, c: the reverse), the difference with its 95% interval
and McNemar's exact p. A question is right when the answer contains the fact's value
(case-folded, spaces and punctuation around digits ignored).
"""
import argparse
import concurrent.futures
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time

FIRST = ["Ambrose", "Beatrix", "Cornelius", "Delphine", "Evander", "Florentia", "Gideon", "Honora", "Isidore",
         "Jocasta", "Lysander", "Marisol", "Octavian", "Perpetua", "Quentin", "Rosalind", "Thaddeus", "Ursula"]
LAST = ["Tillingham", "Ashcombe", "Whitlock", "Penhallow", "Marchbank", "Quarrington", "Everleigh", "Dunmore",
        "Halloway", "Kestrel", "Ravensworth", "Stallard", "Fenwick", "Godolphin", "Brackenbury"]
PLACES = ["Tewkesbury", "Lindisfarne", "Aberystwyth", "Penzance", "Kirkcudbright", "Ludlow", "Saltash",
          "Whitby", "Dunwich", "Ambleside", "Cromarty", "Lostwithiel"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
THINGS = ["the north granary", "the old chapel vault", "the harbour office", "the east tower archive",
          "the apothecary's cabinet", "the schoolhouse safe", "the mill's strongbox", "the lighthouse store"]


def make_fact(rng, k):
    """One fact: (sentence to insert, question, expected answer). k decorrelates subjects."""
    thing = THINGS[k % len(THINGS)] + (" " + str(k // len(THINGS) + 2) if k >= len(THINGS) else "")
    kind = rng.randrange(6)
    if kind == 0:
        v = str(rng.randrange(10000, 100000))
        return (f"The key to {thing} was kept under the access code {v}, written in the ledger.",
                f"What access code was written in the ledger for {thing}?", v)
    if kind == 1:
        v = str(rng.randrange(100000, 1000000))
        return (f"For {thing}, the clerk noted the reference number {v} on the receipt.",
                f"Which reference number did the clerk note for {thing}?", v)
    if kind == 2:
        v = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        return (f"The keeper of {thing} that year was a person named {v}.",
                f"What was the name of the keeper of {thing}?", v)
    if kind == 3:
        v = str(rng.randrange(12, 990))
        return (f"Repairs to {thing} cost exactly {v} pounds, paid in the spring.",
                f"How many pounds did the repairs to {thing} cost?", v)
    if kind == 4:
        v = rng.choice(DAYS)
        return (f"Deliveries to {thing} came only on {v}, never on another day.",
                f"On which day of the week did deliveries to {thing} come?", v)
    v = rng.choice(PLACES)
    return (f"The timber for {thing} was shipped from a town called {v}.",
            f"From which town was the timber for {thing} shipped?", v)


LOG_LOCK = threading.Lock()


def norm(s):
    return re.sub(r"(?<=\d)[\s,.\-](?=\d)", "", s.casefold())


def right(answer, value):
    return norm(value) in norm(answer)


def count_tokens(binary, model, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([binary, "tokenize", "-m", model, "-f", f.name], capture_output=True, text=True)
        m = re.search(r"(\d+) tokens", r.stderr)
        return int(m.group(1)) if m else None
    finally:
        os.unlink(f.name)


def make_docs(args, binary):
    rng = random.Random(args.seed)
    books = sorted(p for p in os.listdir(args.corpus) if p.endswith(".txt") and "python" not in p)
    docs = []
    for d in range(args.docs):
        book = open(os.path.join(args.corpus, books[d % len(books)]), encoding="utf-8").read()
        chars = int(args.tokens * 3.6)
        start = rng.randrange(len(book) // 10, max(len(book) // 10 + 1, len(book) - chars))
        paras = [p for p in book[start:start + chars].split("\n\n") if p.strip()][1:]
        facts = [make_fact(rng, k) for k in range(args.facts)]
        depths = sorted(rng.random() * 0.94 + 0.03 for _ in facts)
        order = list(range(len(facts)))
        rng.shuffle(order)
        out, fi = [], 0
        for i, p in enumerate(paras):
            out.append(p)
            while fi < len(facts) and i >= depths[fi] * len(paras):
                out.append(facts[order[fi]][0])
                fi += 1
        out += [facts[order[j]][0] for j in range(fi, len(facts))]
        text = "\n\n".join(out)
        n = count_tokens(binary, args.model, text) if binary else None
        docs.append({"name": f"{books[d % len(books)]}@{start}", "text": text, "facts": facts, "tokens": n})
    return docs


def run_arm(args, name, flags, docs, log):
    cmd = [args.binary, "serve", "--jsonl", "-m", args.model, "-t", str(args.threads)] + shlex.split(flags)
    env = dict(os.environ)
    if args.cache:
        env["XDG_CACHE_HOME"] = args.cache
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    res = []
    for di, d in enumerate(docs):
        if di < args.from_doc:
            continue
        for qi, (_, q, v) in enumerate(d["facts"]):
            req = {"id": f"{di}.{qi}", "op": "ask", "docs": [{"name": "document.txt", "text": d["text"]}],
                   "question": q, "temperature": 0, "max_tokens": args.max_tokens, "stream": False}
            t0 = time.time()
            p.stdin.write(json.dumps(req) + "\n")
            p.stdin.flush()
            ev = None
            while True:
                line = p.stdout.readline()
                if not line:
                    sys.exit(f"qa_pairs: arm {name}: the server ended ({' '.join(cmd)})")
                ev = json.loads(line)
                if ev.get("event") in ("done", "error"):
                    break
            text = ev.get("text", "") if ev["event"] == "done" else ""
            rec = {"arm": name, "doc": di, "q": qi, "value": v, "right": right(text, v), "answer": text,
                   "ttft_ms": ev.get("ttft_ms"), "wall_s": round(time.time() - t0, 2), "tokens": d["tokens"],
                   "error": ev.get("message") if ev["event"] == "error" else None}
            res.append(rec)
            with LOG_LOCK:
                log.write(json.dumps(rec) + "\n")
                log.flush()
            print(f"{name} d{di} q{qi}: {'ok ' if rec['right'] else 'MISS'} {v!r} <- {text.strip()[:60]!r} "
                  f"({rec['wall_s']} s)", file=sys.stderr)
    p.stdin.close()
    p.wait()
    return res


def mcnemar_p(b, c):
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(__file__), "..", "build", "cli", "ridgekv"))
    ap.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpus"))
    ap.add_argument("--tokens", type=int, default=8000, help="document length (approximate, tokens)")
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--from-doc", type=int, default=0,
                    help="ask only about documents from this one on (the documents stay those of --seed and --docs, "
                         "so a campaign can be split or resumed)")
    ap.add_argument("--facts", type=int, default=20, help="facts (= questions) per document")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cache", help="XDG_CACHE_HOME for the servers (default: the user's)")
    ap.add_argument("--arm", action="append", required=True, help="NAME=FLAGS (the first is the reference)")
    ap.add_argument("--out", required=True, help="results, one JSON line per answer")
    ap.add_argument("--parallel", action="store_true",
                    help="run the arms at the same time, one server each (for answers, not timings: "
                         "give each server its share of the cores with --threads)")
    args = ap.parse_args()
    arms = [a.split("=", 1) if "=" in a else (a, "") for a in args.arm]
    docs = make_docs(args, args.binary)
    print("qa_pairs: documents of " + ", ".join(str(d["tokens"]) for d in docs) + " tokens", file=sys.stderr)
    results = {}
    with open(args.out, "a") as log:
        if args.parallel:
            with concurrent.futures.ThreadPoolExecutor(len(arms)) as ex:
                futs = {name: ex.submit(run_arm, args, name, flags, docs, log) for name, flags in arms}
                results = {name: f.result() for name, f in futs.items()}
        else:
            for name, flags in arms:
                results[name] = run_arm(args, name, flags, docs, log)
    ref = arms[0][0]
    for name, _ in arms:
        r = results[name]
        print(f"{name}: {sum(x['right'] for x in r)}/{len(r)} right")
    for name, _ in arms[1:]:
        a, o = results[ref], results[name]
        b = sum(1 for x, y in zip(a, o) if x["right"] and not y["right"])
        c = sum(1 for x, y in zip(a, o) if not x["right"] and y["right"])
        n = len(a)
        d = (c - b) / n
        se = math.sqrt(max((b + c) / n - d * d, 0) / n)
        print(f"{name} vs {ref}: b={b} c={c} diff {100 * d:+.1f} points "
              f"(95% {100 * (d - 1.96 * se):+.1f}..{100 * (d + 1.96 * se):+.1f}), McNemar p={mcnemar_p(b, c):.3f}")


if __name__ == "__main__":
    main()
