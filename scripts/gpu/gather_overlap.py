#!/usr/bin/env python3
"""How much of zero3's parameter all-gathers the training thread spends computing (the prefetch's
overlap), from a CPU run's step profile ([log] profile_start_step; gloo's collectives run on their
own threads): python3 scripts/gpu/gather_overlap.py OUT/profile/rank0.trace.json
"""
import json, sys
t = json.load(open(sys.argv[1]))
ev = [e for e in t.get('traceEvents', t) if e.get('ph') == 'X']
gathers = [(e['ts'], e['ts'] + e['dur']) for e in ev if e['name'] == 'gloo:all_gather']
gloo_tids = {e['tid'] for e in ev if e['name'].startswith('gloo:')}
compute = sorted((e['ts'], e['ts'] + e['dur']) for e in ev if e['tid'] not in gloo_tids and
                 e['name'] in ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::_scaled_dot_product_flash_attention_for_cpu',
                               'aten::_scaled_dot_product_attention_math', 'aten::mul', 'aten::add', 'aten::linear'))
def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]: out[-1][1] = max(out[-1][1], b)
        else: out.append([a, b])
    return out
cu = union(compute); gu = union(gathers)
inter = sum(max(0, min(b, d) - max(a, c)) for a, b in gu for c, d in cu)
total = sum(b - a for a, b in gu)
print(f"{len(gathers)} all-gathers, {total/1e3:.1f} ms in flight; training thread computing during {inter/1e3:.1f} ms "
      f"of it ({100*inter/max(total,1):.0f}%)")
