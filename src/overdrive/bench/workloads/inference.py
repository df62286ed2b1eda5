"""Inference latency: p50/p95/p99 per batch size and mode, and the largest batch that keeps p99
under an SLO (an ad auction's window is ~10 ms).

Workloads: the click model (batch 1 to 4096), the reference GPT's prefill (a prompt) and its
single-token decode with a KV cache. Modes: fp32 eager under no_grad, fp32 under
torch.inference_mode, bf16 weights under inference_mode, torch.compile (dynamic batch), and on GPU
CUDA graphs (compile mode "reduce-overhead"). Every sample is one call, synchronized (CUDA events on
GPU, through the one clock `timing.time_fn`); (batch, mode) pairs are interleaved in rounds by the
one scheduler `timing.interleaved_rounds`. A mode stops growing its batch once p50 passes 20x the
SLO: larger batches only get slower. `--data FILE` (text) gives the GPT prompts; the click model
takes a Criteo TSV through the recsys workload's reader.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass


from overdrive.bench.workloads.base import BaseWorkload
from overdrive.measure.rounds import interleaved_rounds, time_fn
from overdrive.env import EnvReport
from overdrive.measure.memory_groups import decode_per_batch, free_memory_bytes, release_memory
from overdrive.measure.percentiles import latency_summary, min_samples
from overdrive.results.latency import LATENCY_SCHEMA

__all__ = ["LATENCY_SCHEMA", "LatencySuite", "LATENCY_SUITES", "run_latency", "InferenceWorkload"]



@dataclass(frozen=True, kw_only=True)
class LatencySuite:
    name: str
    recsys_batches: tuple[int, ...]
    gpt_size: str
    prefill_len: int
    prefill_batches: tuple[int, ...]
    decode_context: int
    decode_batches: tuple[int, ...]
    rounds: int
    reps: int
    compile: bool = True
    table_scale: float = 1.0
    """Multiplies the click model's table sizes (1.0 = 1.3M rows)."""
    serve_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    """Batch sizes whose service times feed the request-stream simulation (the batcher's choices)."""
    serve_rounds: int = 20
    serve_reps: int = 30
    """serve_rounds x serve_reps samples per (engine, batch): 600 >= the 368 a p99 needs; the rounds
    are the unit of evidence (the bootstrap of the rate resamples them), so many short ones: 20 keep 12
    after trimming (Student's t for 11 degrees of freedom widens the interval 1.12x, 5 would 1.31x)."""
    serve_min_round_ms: float = 20.0
    """A key's calls in a round last at least this long: more than serve_reps calls when they are short
    (serve.engines.measure_service); 0 = exactly serve_reps."""
    serve_resamples: int = 40
    """Bootstrap resamples over the rounds (the rate's interval, each setting's held rate)."""
    pair_budget_s: float = 3.0
    """Fixed-batch table: a (mode, batch) gets the samples a p99 needs when that fits this many seconds."""
    serving_only: bool = False
    """Only the click model under a request stream (no fixed-batch tables, no GPT)."""


LATENCY_SUITES = {
    "inference-quick": LatencySuite(name="inference-quick", recsys_batches=(1, 16, 256, 4096), gpt_size="cpu-student",
                                    prefill_len=64, prefill_batches=(1, 8), decode_context=64,
                                    decode_batches=(1, 8, 64), rounds=3, reps=7, compile=False,
                                    serve_batches=(1, 4, 16, 64), serve_rounds=8, serve_reps=15, serve_resamples=20,
                                    pair_budget_s=1.0),
    "inference": LatencySuite(name="inference", recsys_batches=(1, 4, 16, 64, 256, 1024, 4096), gpt_size="cpu-student",
                              prefill_len=128, prefill_batches=(1, 4, 16), decode_context=128,
                              decode_batches=(1, 4, 16, 64), rounds=4, reps=10),
    "inference-serving": LatencySuite(name="inference-serving", recsys_batches=(), gpt_size="cpu-student",
                                      prefill_len=0, prefill_batches=(), decode_context=0, decode_batches=(),
                                      rounds=4, reps=10, serving_only=True),
    "inference-gpu": LatencySuite(name="inference-gpu", recsys_batches=(1, 4, 16, 64, 256, 1024, 4096),
                                  gpt_size="gpt-350m", prefill_len=1024, prefill_batches=(1, 4, 16),
                                  decode_context=1024, decode_batches=(1, 8, 64, 256), rounds=4, reps=20,
                                  table_scale=8.0, serve_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)),
}


def _pct(xs: list[float]) -> dict:
    """p50/p95/p99 with their order-statistic intervals; a percentile is None when the samples cannot
    bound it (p99 needs 368), and `note` says so."""
    return latency_summary(xs)


def _slo_verdict(st: dict, slo_ms: float) -> str:
    """"meets" (p99 estimated <= SLO), "misses" (an estimated percentile already above it: p99 is at
    least that), or "unknown" (p99 not estimable and nothing estimated above the SLO)."""
    if st.get("p99") is not None:
        return "meets" if st["p99"] <= slo_ms else "misses"
    if any(st.get(p) is not None and st[p] > slo_ms for p in ("p50", "p95")):
        return "misses"
    return "unknown"


def _modes(env: EnvReport, suite: LatencySuite) -> dict[str, str | None]:
    """mode -> None if it runs here, else the reason it does not."""
    modes: dict[str, str | None] = {"fp32-no_grad": None, "fp32-inference_mode": None, "bf16-inference_mode": None}
    if suite.compile:
        st = env.engine("torch.compile")
        modes["compile"] = None if st.ok else f"torch.compile {st.status}: {st.reason}"
    # CUDA graphs are a compile too (mode "reduce-overhead", one capture per static shape): a suite that
    # leaves compiles out (inference-quick, the GPU check's) leaves them out as well.
    modes["cuda-graphs"] = ("this suite runs no compile (CUDA graphs are captured by torch.compile)"
                            if not suite.compile else None if env.has_gpu and env.engine_ok("torch.compile") else
                            "CUDA graphs need a GPU (and torch.compile)")
    return modes


def _wrap(model, mode: str) -> tuple[object, Callable[[], contextlib.AbstractContextManager]]:
    import torch

    m = copy.deepcopy(model).eval()
    if mode.startswith("bf16"):
        m = m.to(torch.bfloat16)
    if mode == "compile":
        m = torch.compile(m, dynamic=True)
    if mode == "cuda-graphs":
        m = torch.compile(m, mode="reduce-overhead")
    ctx = torch.no_grad if mode == "fp32-no_grad" else torch.inference_mode
    return m, ctx


def _measure(calls: dict[tuple[str, int], Callable[[], object]], suite: LatencySuite, slo_ms: float, cuda: bool,
             progress=None, label: str = "") -> dict[tuple[str, int], dict | str]:
    """Interleaved rounds over (mode, batch); returns stats or a skip reason per pair."""
    out: dict[tuple[str, int], dict | str] = {}
    samples: dict[tuple[str, int], list[float]] = {k: [] for k in calls}
    too_slow: dict[str, int] = {}
    reps: dict[tuple[str, int], int] = {}
    for key, fn in calls.items():  # warm-up (and compilation) per pair, in batch order per mode
        mode, b = key
        if mode in too_slow and b > too_slow[mode]:
            out[key] = f"skipped: batch {too_slow[mode]} already took over {20 * slo_ms:.0f} ms"
            continue
        try:
            fn()
            t = time_fn(fn, cuda=cuda)
        except Exception as e:  # noqa: BLE001 — a mode that fails here is a result
            out[key] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
            continue
        if t > 20 * slo_ms:
            too_slow.setdefault(mode, b)
        need = -(-min_samples(99) // suite.rounds)  # per round, for 368 samples in all
        reps[key] = need if t / 1e3 * need * suite.rounds <= suite.pair_budget_s else suite.reps
    live = [k for k in calls if k not in out]
    task = progress.add_task(label, total=suite.rounds) if progress else None

    def run_one(key, _k) -> bool:
        for _ in range(reps[key]):  # one call per sample: the tail (p99) is what an SLO is about
            samples[key].append(time_fn(calls[key], cuda=cuda))
        return True

    interleaved_rounds(live, run_one, rounds=suite.rounds,
                       on_round=(lambda *_: progress.update(task, advance=1)) if progress else None)
    for key in live:
        out[key] = _pct(samples[key])
    return out


def _summarize(stats: dict, modes: dict[str, str | None], batches: tuple[int, ...], slo_ms: float, unit: str) -> dict:
    res = {"unit": unit, "modes": {}}
    for mode, why in modes.items():
        if why:
            res["modes"][mode] = {"status": "unavailable", "reason": why, "batches": {}}
            continue
        rows, slo_b, slo_tp = {}, None, None
        for b in batches:
            st = stats.get((mode, b))
            if isinstance(st, str):
                rows[str(b)] = {"status": st}
                continue
            st = dict(st, throughput=b / (st["p50"] / 1e3) if st.get("p50") else None,
                      slo=_slo_verdict(st, slo_ms))
            rows[str(b)] = st
            if st["slo"] == "meets":
                slo_b, slo_tp = b, st["throughput"]
        res["modes"][mode] = {"status": "ok", "batches": rows, "slo_batch": slo_b, "slo_throughput": slo_tp}
    ok = [(m, d) for m, d in res["modes"].items() if d.get("slo_batch")]
    if ok:
        m, d = max(ok, key=lambda x: x[1]["slo_throughput"])
        res["best"] = {"mode": m, "batch": d["slo_batch"], "throughput": d["slo_throughput"],
                       "text": f"largest batch under p99 <= {slo_ms:g} ms: {d['slo_batch']} with {m} "
                               f"({d['slo_throughput']:,.0f} {unit})"}
    else:
        res["best"] = {"mode": None, "batch": None, "throughput": None,
                       "text": f"no batch meets p99 <= {slo_ms:g} ms here"}
    return res


def _loads(before: dict, after: dict) -> dict:
    return {"before": before, "after": after, "busy": bool(before.get("busy") or after.get("busy"))}


def run_latency(suite: LatencySuite, env: EnvReport, *, slo_ms: float = 10.0, seed: int = 0, progress=None,
                model=None) -> dict:
    """The fixed-batch latency tables of the built-in models and the click model under a request stream;
    with `model` (a user's `serve.export.ServedModel`) or a serving-only suite, the request stream alone."""
    import torch

    from overdrive.bench.provenance import header
    from overdrive.serve.serving import run_serving

    torch.manual_seed(seed)
    head = {**header(LATENCY_SCHEMA, env), "suite": dict(suite.__dict__), "slo_ms": slo_ms}
    if suite.serving_only or model is not None:
        serving = run_serving(suite, env, slo_ms=slo_ms, seed=seed, progress=progress, model=model)
        what = "click model" if model is None else model.identity["factory"]
        return {**head, "workloads": {}, "serving": serving,
                "recommendation": {"text": f"{what} under a request stream: {serving['text']}"}}
    from overdrive.measure.threads import load_report

    load_before = load_report()
    modes = _modes(env, suite)
    run = _Tables(suite, env, slo_ms, seed, progress, modes)
    workloads = {"recsys": run.click()}
    serving = run_serving(suite, env, slo_ms=slo_ms, seed=seed, progress=progress)
    workloads.update(run.gpt())
    return {**head, "workloads": workloads, "serving": serving, "load": _loads(load_before, load_report()),
            "recommendation": {"text": f"click model under a request stream: {serving['text']}; " +
                               "; ".join(f"{k}: {w['best']['text']}" for k, w in workloads.items())}}


class _Tables:
    """The fixed-batch tables: the click model, the reference GPT's prefill and its one-token decode."""

    def __init__(self, suite: LatencySuite, env: EnvReport, slo_ms: float, seed: int, progress, modes: dict) -> None:
        self.suite, self.slo_ms, self.seed, self.progress, self.modes = suite, slo_ms, seed, progress, modes
        self.dev, self.cuda = env.device, env.has_gpu

    def measure(self, calls: dict, label: str) -> dict:
        return _measure(calls, self.suite, self.slo_ms, self.cuda, self.progress, label)

    def click(self) -> dict:
        import torch

        from overdrive.recsys import DLRM, CriteoSpec, DLRMServing, padded_ids, synthetic_clicks

        suite, dev = self.suite, self.dev
        spec = CriteoSpec(table_sizes=tuple(max(10, int(n * suite.table_scale)) for n in CriteoSpec().table_sizes))
        click = DLRMServing(DLRM(spec)).to(dev)
        data = synthetic_clicks(max(suite.recsys_batches), spec, seed=self.seed)
        ids, dense = padded_ids(data, 5).to(dev), data.dense.to(dev)
        calls = {}
        for mode in (m for m, why in self.modes.items() if not why):
            m, ctx = _wrap(click, mode)
            for b in suite.recsys_batches:
                d = dense[:b].to(torch.bfloat16) if mode.startswith("bf16") else dense[:b]

                def fn(m=m, ctx=ctx, d=d, i=ids[:b]):
                    with ctx():
                        return m(d, i)

                calls[(mode, b)] = fn
        out = _summarize(self.measure(calls, "latency: click model"), self.modes, suite.recsys_batches, self.slo_ms,
                         "examples/s")
        return {**out, "model": f"DLRM, {sum(spec.table_sizes):,} embedding rows"}

    def gpt(self) -> dict:
        """Prefill (a prompt) and one-token decode with a KV cache, of the suite's reference GPT."""
        import torch

        from overdrive.models import GPT, gpt_config

        suite = self.suite
        cfg = gpt_config(suite.gpt_size, block_size=max(suite.prefill_len, suite.decode_context + 1))
        gpt = GPT(cfg).to(self.dev).eval()
        gen = torch.Generator().manual_seed(self.seed)
        calls = {}
        for mode in (m for m, why in self.modes.items() if not why):
            m, ctx = _wrap(gpt, mode)
            for b in suite.prefill_batches:
                x = torch.randint(0, cfg.vocab_size, (b, suite.prefill_len), generator=gen).to(self.dev)

                def fn(m=m, ctx=ctx, x=x):
                    with ctx():
                        return m(x)[0][:, -1]

                calls[(mode, b)] = fn
        prefill = _summarize(self.measure(calls, "latency: GPT prefill"), self.modes, suite.prefill_batches,
                             self.slo_ms, "sequences/s")
        return {"gpt_prefill": {**prefill, "model": f"{suite.gpt_size}, prompt {suite.prefill_len} tokens"},
                "gpt_decode": self.decode(gpt, cfg, gen)}

    def decode(self, gpt, cfg, gen) -> dict:
        import torch

        suite, c = self.suite, self.suite.decode_context
        dec_modes = {m: (w or ("the KV-cache decode loop is not compiled here" if m in ("compile", "cuda-graphs")
                               else None)) for m, w in self.modes.items()}
        models = {mode: (copy.deepcopy(gpt).eval().to(torch.bfloat16 if mode.startswith("bf16") else torch.float32),
                         torch.no_grad if mode == "fp32-no_grad" else torch.inference_mode)
                  for mode, why in dec_modes.items() if not why}

        def build(mode: str, b: int):
            m, ctx = models[mode]
            x = torch.randint(0, cfg.vocab_size, (b, c), generator=gen).to(self.dev)
            with ctx():
                caches = [{} for _ in m.blocks]
                m.decode(x, caches, 0)

            def fn(m=m, ctx=ctx, caches=caches, nxt=x[:, -1:]):
                with ctx():
                    out = m.decode(nxt, caches, c)
                for cache in caches:  # keep the context at c tokens for the next sample
                    cache["k"], cache["v"] = cache["k"][:, :, :c], cache["v"][:, :, :c]
                return out

            return fn, caches

        def cache_bytes(mode: str, b: int) -> int:
            # k and v per block: (B, heads, context + 1, head dim) = B * (context + 1) * n_embd elements each,
            # plus one block's pair again while a step's torch.cat builds the longer one.
            return 2 * b * (c + 1) * cfg.n_embd * (2 if mode.startswith("bf16") else 4) * (cfg.n_layer + 1)

        st = decode_per_batch(list(models), suite.decode_batches, build=build, cache_bytes=cache_bytes,
                              free_bytes=lambda: free_memory_bytes(self.dev), release=lambda: release_memory(self.dev),
                              measure=lambda calls: self.measure(calls, f"latency: GPT decode, batch "
                                                                        f"{next(iter(calls))[1]}"))
        out = _summarize(st, dec_modes, suite.decode_batches, self.slo_ms, "tokens/s")
        return {**out, "model": f"{suite.gpt_size}, one token after {c} (KV cache)"}


class InferenceWorkload(BaseWorkload):
    """Latency under an SLO: measured in this process (one model per mode), not in training workers."""
    name = "inference"
    task = "inference"
    kind = "latency"
    help = "latency p50/p95/p99 per batch size and mode, and the largest batch under --slo-ms"
    roles = ()
    configs_apply = False
    threads_apply = False
    serves_models = True

    @property
    def suites(self) -> dict:
        return LATENCY_SUITES

    def default_suite(self, *, has_gpu: bool, quick: bool) -> str:
        return "inference-gpu" if has_gpu else ("inference-quick" if quick else "inference")

    def check_data(self, path: str) -> str:
        from overdrive.data import DataError

        raise DataError("--data does not apply to --workload inference: latency depends on shapes, not values, so "
                        "it runs on synthetic inputs (drop --data)")

    def run(self, suite: LatencySuite, env: EnvReport, *, slo_ms: float, seed: int = 0, progress=None,
            model=None) -> dict:
        """The whole measurement (this workload's kind is "latency": no training workers)."""
        return run_latency(suite, env, slo_ms=slo_ms, seed=seed, progress=progress, model=model)

    def title(self, suite: dict) -> str:
        what = "the click model under a request stream" if suite.get("serving_only") else (
            f"the click model, {suite.get('gpt_size')} prefill and decode, per batch size and mode")
        return f"suite {suite.get('name')}: inference latency of {what}"

    def apply_hint(self, cfg: dict) -> dict:
        """`cfg`: a table's best record ({"mode", "batch"}): the export sized to that batch."""
        return {"code": f"overdrive export --model recsys --max-batch {cfg.get('batch') or 'N'} --out export/",
                "train": None}
