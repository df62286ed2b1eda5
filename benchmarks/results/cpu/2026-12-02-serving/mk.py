import json, itertools
from overdrive.serve.serving import agree, _short
import os
D=os.path.dirname(os.path.abspath(__file__))
runs=["n5","n6","full1","full2","n7","n8","c1","c2"]
rs={r: json.load(open(f"{D}/{r}/results.json")) for r in runs}
print("| run | suite | load before→after | verdict | eager | compiled | onnxruntime |\n|---|---|---|---|---|---|---|")
for r in runs:
    sv=rs[r]["serving"]; cells=[]
    for e in ("eager","compiled","onnxruntime"):
        x=sv["engines"][e]; b=x.get("best")
        cells.append(f"{b['rate']/1e3:.1f}k [{b['ci'][0]/1e3:.1f}–{b['ci'][1]/1e3:.1f}k] {_short(b['config'])}" if b else "withheld: "+(x.get("withheld") or "")[:60].split(" (")[0])
    print(f"| {r} | {rs[r]['suite']['name']} | {sv['load']['before']['load1']}→{sv['load']['after']['load1']} | {sv['verdict']} | "+" | ".join(cells)+" |")
print("\n| pair | host shift (median service p50) | eager | compiled | onnxruntime |\n|---|---|---|---|---|")
tot=0
for a,b in itertools.combinations(runs,2):
    g=agree(rs[a]["serving"],rs[b]["serving"]); tot+=g["contradictions"]; sh=g["host_shift"]
    print(f"| {a}–{b} | {sh['pct']:+.0f}% | "+" | ".join(g["engines"][e]["status"] for e in ("eager","compiled","onnxruntime"))+" |")
print(f"\ncontradictions: {tot} of {len(runs)*(len(runs)-1)//2*3} engine pairs")
