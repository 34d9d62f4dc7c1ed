# Sum an ncu CSV (tools/gpu, docs/GPU.md "Run 18") by kernel and grid: launches,
# time, DRAM bytes, GB/s, registers, occupancy.
# Usage: python3 ncu_table.py FILE.csv[.gz] [--ids A:B] [--top N]
# --ids keeps the launches whose position in the file is in [A, B) (0-based),
# e.g. one window of `run.sh ncu-windows` by the launch counts it printed.
import argparse, collections, csv, gzip, io

ap = argparse.ArgumentParser()
ap.add_argument('file')
ap.add_argument('--ids', default=None)
ap.add_argument('--top', type=int, default=30)
a = ap.parse_args()
opener = gzip.open if a.file.endswith('.gz') else open
rows = [l for l in opener(a.file, 'rt') if l.startswith('"')]
r = list(csv.DictReader(io.StringIO(''.join(rows))))
order = list(dict.fromkeys(x['ID'] for x in r))
if a.ids:
    lo, hi = (int(v) for v in a.ids.split(':'))
    keep = set(order[lo:hi])
    r = [x for x in r if x['ID'] in keep]
k = collections.defaultdict(lambda: collections.defaultdict(float))
ids = set()
for x in r:
    key = (x['Kernel Name'].split('(')[0], x['Grid Size'] if 'Grid Size' in x else '')
    m = x['Metric Name']; v = float(x['Metric Value'].replace(',', '') or 0)
    k[key][m] += v if m in ('gpu__time_duration.sum', 'dram__bytes_read.sum') else 0
    if m in ('launch__registers_per_thread', 'sm__warps_active.avg.pct_of_peak_sustained_active',
             'launch__grid_size', 'launch__block_size'):
        k[key][m] = v
    if m == 'gpu__time_duration.sum':
        k[key]['n'] += 1; ids.add(x['ID'])
units = {x['Metric Name']: x['Metric Unit'] for x in r}
print(units)
tot = sum(v['gpu__time_duration.sum'] for v in k.values())
print('launches', len(ids), 'total', tot)
for key, v in sorted(k.items(), key=lambda kv: -kv[1]['gpu__time_duration.sum'])[:a.top]:
    t = v['gpu__time_duration.sum']; b = v['dram__bytes_read.sum']
    print(f"{key[0][:40]:40s} grid={v['launch__grid_size']:>8.0f} blk={v['launch__block_size']:>4.0f} n={v['n']:4.0f} t={t:10.0f} per={t/v['n']:8.1f} MB={b/1e6:8.1f} GB/s={b/t if t else 0:7.0f} regs={v['launch__registers_per_thread']:.0f} occ={v['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f}")
