# e4m3 and bf16 at H=32 T=256 through `mla-sink bench`, three arrangements of e4m3's unsplit 32-head launches,
# each in fresh processes, interleaved; one summary line per process
mkdir -p /tmp/modes
for r in 1 2 3 4 5; do
  for t in main colsplit altblocks; do
    (cd out/$t && PYTHONPATH=. timeout 100 python3 -u -m mla_sink bench --no-peers \
      --cases "kv_fp8_e4m3-h32-sm90-sinks-dcp1-T256-,bf16-h32-sm90-sinks-dcp1-T256-" \
      --json /tmp/modes/${t}_r$r.json > /tmp/modes/${t}_r$r.log 2>&1
     python3 -c "
import json; d=json.load(open('/tmp/modes/${t}_r$r.json'))
print('$t r$r', ' '.join(c['case'].split('-')[0] + '=' + format(c['impls']['triton']['us'], '.2f') for c in d['results']))")
  done
done
cd /tmp/modes && tar czf $OUT/modes.tgz *.json
