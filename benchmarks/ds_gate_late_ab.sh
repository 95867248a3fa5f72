# A/B: library V3.2 calls, base (plain gated launch after unsplit seesaw) vs late (seesaw triggers its dependents at
# its end, the gated launch a programmatic dependent), trees interleaved, fresh processes
for r in 1 2; do
  for t in base late; do
    (cd out/$t && PYTHONPATH=. timeout 150 python3 -u ../../benchmarks/ds_gate_cost.py /tmp/gate_${t}_$r.json 2>&1 | python3 -c "
import sys, json
for l in sys.stdin:
    if l.startswith('{'):
        d = json.loads(l); print('$t r$r', d['H'], d['T'], round(d['library_us'], 2), d.get('flagging_alone_us') and round(d['flagging_alone_us'], 2), d.get('max_abs_diff_out'))
    elif 'Error' in l or 'error' in l: print(l.strip()[:300])
")
  done
done
