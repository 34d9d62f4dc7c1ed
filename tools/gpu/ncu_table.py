# Sum an ncu CSV (tools/gpu, docs/GPU.md "Run 18") by kernel and grid: launches,
# time, DRAM bytes, GB/s, registers, occupancy. Usage: python3 ncu_table.py FILE.csv.gz
import csv, gzip, sys, io, collections
rows = [l for l in gzip.open(sys.argv[1], 'rt') if l.startswith('"')]
r = list(csv.DictReader(io.StringIO(''.join(rows))))
k = collections.defaultdict(lambda: collections.defaultdict(float))
ids=set()
for x in r:
    key = (x['Kernel Name'].split('(')[0], x['Grid Size'] if 'Grid Size' in x else '')
    m = x['Metric Name']; v = float(x['Metric Value'].replace(',','') or 0)
    k[key][m] += v if m in ('gpu__time_duration.sum','dram__bytes_read.sum') else 0
    if m in ('launch__registers_per_thread','sm__warps_active.avg.pct_of_peak_sustained_active','launch__grid_size','launch__block_size'):
        k[key][m] = v
    if m == 'gpu__time_duration.sum':
        k[key]['n'] += 1; ids.add(x['ID'])
units = {x['Metric Name']: x['Metric Unit'] for x in r}
print(units)
tot = sum(v['gpu__time_duration.sum'] for v in k.values())
print('launches', len(ids), 'total', tot)
for key, v in sorted(k.items(), key=lambda kv: -kv[1]['gpu__time_duration.sum'])[:30]:
    t = v['gpu__time_duration.sum']; b = v['dram__bytes_read.sum']
    print(f"{key[0][:40]:40s} grid={v['launch__grid_size']:>8.0f} blk={v['launch__block_size']:>4.0f} n={v['n']:4.0f} t={t:10.0f} per={t/v['n']:8.1f} MB={b/1e6:8.1f} GB/s={b/t if t else 0:7.0f} regs={v['launch__registers_per_thread']:.0f} occ={v['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f}")
