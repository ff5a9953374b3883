"""One line per live run directory (BENCHMARKS §13, the next epoch sampled while this one trains):
epoch time per epoch (slowest rank), its mean over all epochs and over epochs 2.., rows fetched /
none's (fetched / remote input rows over the ranks), hits / Belady over all remote nodes (needs
`rudder oracle RUN_DIR` first), the first minibatch's t_load and t_sample_wait per epoch (slower
rank), rank 0's val acc per epoch.

  python benchmarks/live_epoch_summary.py runs/<id> [runs/<id> ...]
"""
import json
import sys
from pathlib import Path

def jl(p):
    return [json.loads(l) for l in Path(p).read_text().splitlines() if l.strip()]

for d in [a for a in sys.argv[1:] if Path(a).is_dir()]:
    d = Path(d)
    ranks = sorted(int(p.stem.split("-r")[1]) for p in d.glob("epochs-r*.jsonl"))
    ep = {r: jl(d / f"epochs-r{r}.jsonl") for r in ranks}
    mb = {r: jl(d / f"minibatches-r{r}.jsonl") for r in ranks}
    tmax = [max(ep[r][e]["t_epoch"] for r in ranks) for e in range(len(ep[0]))]
    fetched = sum(m["fetched_rows"] for r in ranks for m in mb[r])
    remote = sum(m["remote_rows"] for r in ranks for m in mb[r])
    hits = sum(m["hits"] for r in ranks for m in mb[r])
    bel = []
    for r in ranks:
        o = d / f"oracle-r{r}.json"
        if o.exists():
            bel.append(json.loads(o.read_text())["belady_all_remote"]["hits"])
    hb = f"{hits / sum(bel):.3f}" if len(bel) == len(ranks) else "n/a"
    first = [max(m["t_load"] for r in ranks for m in mb[r] if m["epoch"] == e and m["step"] == 0)
             for e in range(len(tmax))]
    fwait = [max(m["t_sample_wait"] for r in ranks for m in mb[r] if m["epoch"] == e and m["step"] == 0)
             for e in range(len(tmax))]
    val = [ep[0][e].get("val_acc") for e in range(len(tmax))]
    print(f"{d.name}: epoch s {' '.join(f'{t:.2f}' for t in tmax)} | mean {sum(tmax)/len(tmax):.2f} "
          f"| ep2-3 {sum(tmax[1:])/len(tmax[1:]):.2f} | rows/none {fetched/remote:.4f} ({fetched}) | hits/Belady {hb} "
          f"| first t_load {', '.join(f'{x:.2f}' for x in first)} | first t_sample_wait "
          f"{', '.join(f'{x:.3f}' for x in fwait)} | val {', '.join(f'{v:.4f}' for v in val)}")
