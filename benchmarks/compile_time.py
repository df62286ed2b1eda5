"""Cold compile time of the GPU bench's models, measured where it can be (a CPU host), to size the steps
of scripts/gpu_check.sh: the first training step of a compiled model minus a later one is the compile.

    python benchmarks/compile_time.py --sizes gpt-125m gpt-350m --seq 128 --batch 1 --out compile_times.json

Dynamo's tracing and Inductor's graph lowering are Python work that the shapes barely change (static
shapes), so a tiny batch measures them on a CPU; the code generation differs (C++ here, Triton on a GPU,
compiled in parallel by Inductor's workers there). The figures are an order of magnitude for the plan,
not the GPU's own compile time, which the GPU bench records as `compile_s` per configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def first_and_later_step(size: str, *, seq: int, batch: int, compiled: bool) -> tuple[float, float]:
    import torch

    from overdrive.models import GPT, gpt_config

    torch.manual_seed(0)
    model = GPT(gpt_config(size, block_size=seq))
    if compiled:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, model.config.vocab_size, (batch, seq))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times[0], min(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["gpt-125m", "gpt-350m"])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for size in args.sizes:
        # a fresh Inductor cache: a warm cache would hide the cold compile the GPU check pays
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="overdrive-compile-")
        eager_first, eager_step = first_and_later_step(size, seq=args.seq, batch=args.batch, compiled=False)
        comp_first, comp_step = first_and_later_step(size, seq=args.seq, batch=args.batch, compiled=True)
        rows.append({"size": size, "seq": args.seq, "batch": args.batch, "eager_first_s": eager_first,
                     "eager_step_s": eager_step, "compiled_first_s": comp_first, "compiled_step_s": comp_step,
                     "compile_s": comp_first - comp_step - (eager_first - eager_step)})
        print(f"{size}: cold compile (fwd+bwd+AdamW) {rows[-1]['compile_s']:.1f} s; step {comp_step:.2f} s compiled, "
              f"{eager_step:.2f} s eager", flush=True)
    doc = {"rows": rows, "load_1min": os.getloadavg()[0], "threads": args.threads, "torch": torch.__version__}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
