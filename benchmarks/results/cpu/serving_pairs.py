"""The serving record's tables: per run the verdicts, per pair of runs `overdrive.serve.agreement.agree`.

    python benchmarks/results/cpu/serving_pairs.py FOLDER RUN [RUN ...]

FOLDER holds one sub-folder per RUN with the run's results.json (`overdrive bench --workload inference
--out FOLDER/RUN`); the markdown tables go to stdout (each record's README.md has them).
"""
import itertools
import json
import os
import sys

from overdrive.serve.agreement import agree
from overdrive.serve.verdict import short as _short

ENGINES = ("eager", "compiled", "onnxruntime")


def main(folder: str, runs: list[str]) -> None:
    rs = {r: json.load(open(os.path.join(folder, r, "results.json"))) for r in runs}
    print("| run | suite | load before→after | verdict | " + " | ".join(ENGINES) + " |\n|---|---|---|---|---|---|---|")
    for r in runs:
        sv, cells = rs[r]["serving"], []
        for e in ENGINES:
            x = sv["engines"][e]
            b = x.get("best")
            cells.append(f"{b['rate']/1e3:.1f}k [{b['ci'][0]/1e3:.1f}–{b['ci'][1]/1e3:.1f}k] {_short(b['config'])}" if b
                         else "withheld: " + (x.get("withheld") or "").split(" (")[0])
        print(f"| {r} | {rs[r]['suite']['name']} | {sv['load']['before']['load1']}→{sv['load']['after']['load1']} | "
              f"{sv['verdict']} | " + " | ".join(cells) + " |")
    print("\n| pair | host shift (median service p50) | " + " | ".join(ENGINES) + " |\n|---|---|---|---|---|")
    total = 0
    for a, b in itertools.combinations(runs, 2):
        g = agree(rs[a]["serving"], rs[b]["serving"])
        total += g["contradictions"]
        print(f"| {a}–{b} | {g['host_shift']['pct']:+.0f}% | " + " | ".join(g["engines"][e]["status"] for e in ENGINES)
              + " |")
    print(f"\ncontradictions: {total} of {len(runs) * (len(runs) - 1) // 2 * len(ENGINES)} engine pairs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
