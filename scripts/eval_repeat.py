#!/usr/bin/env python3
"""Repetition guards on the default model, quality only (no timings): for each sampler
setting, through one `ridgekv serve --jsonl` process,
  - QA: facts inserted into short passages of ../shared/corpus, asked greedily with `ask`
    (correct when the answer holds the fact's key words), paired across settings;
  - loops: `ask` over this repository's README.md "What does this project do?" (-n 256,
    greedy and three seeds at the default sampling) and a chat that sends its question
    twice: the sentences of each answer that repeat an earlier sentence of that answer.
usage: scripts/eval_repeat.py [--bin build/cli/ridgekv] [--corpus ../shared/corpus] [-t 1]
       [--settings 0,1] [--haystacks 1] [--loops 2]   (run one setting per process, in parallel,
       and compare the printed answers)
Prints one table; the needle line is `ridgekv eval needle --dry-multiplier M ...`."""
import argparse
import json
import os
import re
import subprocess
import sys

FACTS = [
    ("The lighthouse keeper was named Tobias Wren.", "What was the lighthouse keeper's name?", ["wren"]),
    ("The treaty was signed in the town of Karvik.", "In which town was the treaty signed?", ["karvik"]),
    ("The secret ingredient of the cake was cardamom.", "What was the secret ingredient of the cake?", ["cardamom"]),
    ("The ship that carried the letters was called the Marigold.", "What was the ship that carried the letters "
     "called?", ["marigold"]),
    ("Mr. Hadley kept exactly 47 sheep on the north farm.", "How many sheep did Mr. Hadley keep on the north farm?",
     ["47"]),
    ("The stolen painting was hidden behind the chapel organ.", "Where was the stolen painting hidden?", ["organ"]),
    ("Miss Pellow's favourite colour was violet.", "What was Miss Pellow's favourite colour?", ["violet"]),
    ("The train to Bexley left at half past nine.", "When did the train to Bexley leave?", ["nine"]),
    ("The family dog was a grey terrier called Biscuit.", "What was the family dog called?", ["biscuit"]),
    ("The inheritance amounted to 3,200 pounds.", "How much did the inheritance amount to?", ["3,200", "3200"]),
    ("The old brass key opened a blue trunk in the attic.", "What did the old brass key open?", ["trunk"]),
    ("Captain Orme was born in the city of Lisbon.", "Where was Captain Orme born?", ["lisbon"]),
]
HAYSTACKS = [("austen_persuasion.txt", 40000), ("doyle_sherlock_holmes_pg1661.txt", 90000)]
SETTINGS = [
    ("off", {"dry_multiplier": 0}),
    ("dry 0.8", {"dry_multiplier": 0.8}),
    ("dry 0.8 + repeat 1.1", {"dry_multiplier": 0.8, "repeat_penalty": 1.1}),
    ("repeat 1.1", {"dry_multiplier": 0, "repeat_penalty": 1.1}),
]


def passage(corpus, name, off, n=1600):
    text = open(os.path.join(corpus, name), encoding="utf-8", errors="replace").read()
    p = text[off:off + n]
    p = p[p.find("\n") + 1:p.rfind("\n")]  # whole lines
    return p


def repeats(text):
    """Sentences (3+ words) that repeat an earlier one of the same text."""
    sents = [re.sub(r"\W+", " ", s).strip().lower() for s in re.split(r"[.!?]\s+|\n+", text)]
    sents = [s for s in sents if len(s.split()) >= 3]
    seen, rep = set(), 0
    for s in sents:
        rep += s in seen
        seen.add(s)
    return rep, len(sents)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/cli/ridgekv")
    ap.add_argument("--corpus", default=os.environ.get("RIDGEKV_CORPUS", "../shared/corpus"))
    ap.add_argument("-t", default="1")
    ap.add_argument("--settings", default="0,1,2,3", help="indices into SETTINGS to run")
    ap.add_argument("--haystacks", type=int, default=len(HAYSTACKS))
    ap.add_argument("--loops", type=int, default=4, help="answers per loop probe: greedy, then seeds 1, 2, 3")
    a = ap.parse_args()
    which = [int(x) for x in a.settings.split(",")]
    readme = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")).read()
    reqs, key = [], {}
    for si, (label, knobs) in enumerate(SETTINGS):
        if si not in which:
            continue
        for hi, (name, off) in enumerate(HAYSTACKS[:a.haystacks]):
            base = passage(a.corpus, name, off)
            for fi, (fact, q, ans) in enumerate(FACTS):
                cut = base.find(". ", len(base) // 2) + 2
                doc = base[:cut] + fact + " " + base[cut:]
                rid = f"qa-{si}-{hi}-{fi}"
                key[rid] = ("qa", si, ans)
                reqs.append(dict(id=rid, op="ask", docs=[{"name": name, "text": doc}], question=q, max_tokens=48,
                                 temperature=0, stream=False, **knobs))
        for k, (temp, seed) in enumerate(((0, 0), (0.8, 1), (0.8, 2), (0.8, 3))[:a.loops]):
            rid = f"loop-{si}-{k}"
            key[rid] = ("loop", si, None)
            reqs.append(dict(id=rid, op="ask", docs=[{"name": "README.md", "text": readme}],
                             question="What does this project do?", max_tokens=256, temperature=temp, seed=seed,
                             stream=False, **knobs))
            q = "Tell me about the history of the bicycle."
            rid = f"chat-{si}-{k}"
            key[rid] = ("loop", si, None)
            reqs.append(dict(id=rid, op="chat", messages=[{"role": "user", "content": q},
                                                          {"role": "assistant", "content": "The bicycle was invented "
                                                           "in the 19th century."},
                                                          {"role": "user", "content": q}],
                             max_tokens=256, temperature=temp, seed=seed, stream=False, **knobs))
    lines = "".join(json.dumps(r) + "\n" for r in reqs)
    out = subprocess.run([a.bin, "serve", "--jsonl", "-t", a.t, "--no-cache"], input=lines, capture_output=True,
                         text=True).stdout
    qa = [[] for _ in SETTINGS]
    loops = []
    rep = [[0, 0, 0] for _ in SETTINGS]  # repeated sentences, sentences, answers with a repeat
    for line in out.splitlines():
        ev = json.loads(line)
        if ev.get("event") not in ("done", "error") or ev.get("id") not in key:
            continue
        kind, si, ans = key[ev["id"]]
        text = ev.get("text", "")
        if ev["event"] == "error":
            print("error:", ev, file=sys.stderr)
        if kind == "qa":
            qa[si].append((ev["id"], any(w in text.lower() for w in ans), text))
        else:
            loops.append((ev["id"], text))
            r, n = repeats(text)
            rep[si][0] += r
            rep[si][1] += n
            rep[si][2] += r > 0
    if any(not qa[si] for si in which):
        print("no answers: see stderr", file=sys.stderr)
    b0 = which[0]  # the reference the pairs are counted against
    base = {i.replace(f"qa-{b0}-", "qa-X-"): ok for i, ok, _ in qa[b0]}
    print(f"{'setting':24} {'QA right':>9} {'b':>3} {'c':>3} {'repeated sentences':>20} {'answers looping':>16}")
    for si in which:
        label = SETTINGS[si][0]
        ok = sum(o for _, o, _ in qa[si])
        b = sum(1 for i, o, _ in qa[si] if base.get(i.replace(f"qa-{si}-", "qa-X-")) and not o)
        c = sum(1 for i, o, _ in qa[si] if not base.get(i.replace(f"qa-{si}-", "qa-X-")) and o)
        print(f"{label:24} {ok:>4}/{len(qa[si]):<4} {b:>3} {c:>3} {rep[si][0]:>9} of {rep[si][1]:<8} "
              f"{rep[si][2]:>8} of {2 * a.loops}")
    print(f"(b: right with {SETTINGS[b0][0]}, wrong here; c: the reverse)")
    for si in which[1:]:
        for (i0, o0, t0), (i1, o1, t1) in zip(qa[b0], qa[si]):
            if t0 != t1:
                print(f"  {SETTINGS[si][0]} {i1}: {t0[:70]!r} -> {t1[:70]!r}")
    for si in which:
        for i, o, t in qa[si]:
            print(f"  {i}: {'ok  ' if o else 'MISS'} {t[:70]!r}")
    for rid, text in loops:
        print(f"  {rid}: {text[:300]!r}")


if __name__ == "__main__":
    main()
