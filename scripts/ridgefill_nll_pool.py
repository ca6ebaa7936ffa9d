#!/usr/bin/env python3
"""Pools `ridgekv eval nll --json` runs of a few windows each (other --seed), for measurements
split into pieces of a few minutes (docs/RIDGEFILL.md).

usage: ridgefill_nll_pool.py PREFIX...   (PREFIX.json = stdout of --json, PREFIX.err = stderr)

Per-window ΔNLL on the scored tokens: from the JSON's window_list[].nll_sum (binaries since
0c1785b), else from the progress lines on stderr ("window k/n FILE: dspeed X dquality Y",
4 decimals). Every window scores the same number of tokens, so the mean of the window deltas
is the ratio of sums; CI: percentile bootstrap over the pooled windows (10,000 resamples, 95%).
Long-range tokens (gain > --gain-threshold): window_list[].long_range_nll_sum when present,
else each run's mean Δ weighted by its n_long_range (exact either way). The top-10% set is
pooled the same way from each run's own threshold (approximate: each run ranks its own tokens).
"""
import json, random, re, sys

wins, lr_sum, lr_n, top_sum, top_n, pre = [], {}, 0, {}, 0, {}
for p in sys.argv[1:]:
    j = json.load(open(p + '.json'))
    score = j['score']
    wl = j['window_list']
    if wl and 'nll_sum' in wl[0]:
        for w in wl:
            d = {m: (w['nll_sum'][m] - w['nll_sum']['off']) / score for m in w['nll_sum'] if m != 'off'}
            wins.append((f"{w['file']}+{w['offset']}", d))
            lr_n += w['n_long_range']
            for m in d: lr_sum[m] = lr_sum.get(m, 0) + w['long_range_nll_sum'][m] - w['long_range_nll_sum']['off']
    else:
        for line in open(p + '.err'):
            m = re.search(r'window \d+/\d+\s+(\S+): (.*?)\s+elapsed', line)
            if m:
                wins.append((m.group(1), {k[1:]: float(v) for k, v in re.findall(r'(d\w+) ([-+0-9.]+)', m.group(2))}))
        n = j['n_long_range']; lr_n += n
        for md in j['modes']:
            if md['mode'] != 'off': lr_sum[md['mode']] = lr_sum.get(md['mode'], 0) + md['long_range']['delta']['est'] * n
    top_n += j['n_top']
    for md in j['modes']:
        pre.setdefault(md['mode'], []).append(md['prefill_s_mean'])
        if md['mode'] != 'off': top_sum[md['mode']] = top_sum.get(md['mode'], 0) + md['top']['delta']['est'] * j['n_top']

random.seed(1)
print(f'{len(wins)} windows; long-range tokens (gain > threshold): {lr_n}; top-share tokens: {top_n}')
for w, d in wins: print('  ', w, ' '.join(f'{k} {v:+.4f}' for k, v in d.items()))
for mo in sorted(lr_sum):
    xs = [d[mo] for _, d in wins]
    bs = sorted(sum(random.choice(xs) for _ in xs) / len(xs) for _ in range(10000))
    print(f'{mo}: ΔNLL last {sum(xs) / len(xs):+.4f} [95% CI {bs[249]:+.4f}, {bs[9749]:+.4f}]  '
          f'Δ long-range {lr_sum[mo] / lr_n:+.3f}  Δ top {top_sum[mo] / top_n:+.3f}  '
          f'mean prefill s per run {", ".join("%.1f" % x for x in pre[mo])}')
print('off: mean prefill s per run', ', '.join('%.1f' % x for x in pre['off']))
