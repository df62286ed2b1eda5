"""The click model served under a request stream: per engine, the highest Poisson rate whose p99
end-to-end latency stays under the SLO, the dynamic-batcher settings that achieve it, and how sure
this run is of both: or, when it cannot be sure, no verdict and the reason.

Measured: per-batch service times of eager, compiled and ONNX Runtime (outputs checked equal first),
in interleaved rounds whose order is shuffled per round (`engines.measure_service`), with A/A twins
of eager at the smallest and the largest batch. Simulated from them: the Triton batcher over the
settings (`batcher.search_settings`). The unit of evidence is the round (the calls of one round share
that moment's contention): the rate's interval and each setting's held rate come from a bootstrap
over rounds, every batch size of a resample taken from the same rounds. The setting recommended is
the one that holds the most (the rate it keeps in 90% of the resamples), not the one fastest on the
pooled samples: near the SLO's edge the fastest is the one a repeated run loses.

Each engine is judged against its own control: its own A/A twins at the smallest batch (eager's also
at the largest); an engine without twins (results written before, a server measured from outside) is
judged against eager's. An engine's verdict is withheld, with the figures and the check that tripped, when
- its control says the host is too busy: a twin pair's per-round interval is wider than `BUSY_FLOOR`
  (the bench's "too busy to judge"), or the twins' highest rates under the SLO differ by more than it;
- the answer is fragile: no setting keeps the SLO in `STABLE_SHARE` of the resamples; a setting not
  equivalent to the recommendation beats it beyond its interval in more than 1 - `STABLE_SHARE` of
  them (a setting at the SLO's edge: a repeated run may count it or not); or the rate is known only
  to wider than ±(BUSY_FLOOR - 1).
Two runs agree (`agree`) when both give a verdict with overlapping intervals and each run's evidence
accepts the other's setting (the same one, or one whose rate there reaches the lower end of that run's
interval); a run that withholds contradicts nothing.

Here: the run (`run_serving`) and its threads. Beside it: one engine's verdict (`verdict`), the run's
results (`summary`), two runs compared (`agreement`), the A/A control (`aa_control`), the simulated
batcher (`batcher`), the engines and their timing (`engines`).
"""

from __future__ import annotations

from overdrive.measure.threads import load_report, plan_threads
from overdrive.serve.aa_control import service_floor
from overdrive.serve.agreement import agree, host_shift
from overdrive.serve.summary import held_text, summarize_serving
from overdrive.serve.verdict import RESAMPLES, STABLE_SHARE, engine_verdict

__all__ = ["run_serving", "click_served_model", "summarize_serving", "service_floor", "engine_verdict", "agree",
           "host_shift", "held_text", "serving_threads", "STABLE_SHARE", "RESAMPLES"]


def run_serving(suite, env, *, slo_ms: float, seed: int = 0, progress=None, model=None) -> dict:
    """Measure the engines on `model` (a `serve.served_model.ServedModel`: a user's FILE.py:FACTORY) or, by
    default, on the suite's click model (table_scale), at the suite's serve_batches, and summarise."""
    import tempfile

    import torch

    from overdrive.serve.engines import MIN_ROUND_MS, check_engines, measure_service, serving_engines

    torch.manual_seed(seed)
    if model is None:
        model = click_served_model(suite, seed)
    batches = list(suite.serve_batches)
    inputs = {b: tuple(model.inputs(b)) for b in batches}
    before = load_report()
    threads, why = serving_threads(before, torch.get_num_threads())
    was = torch.get_num_threads()
    torch.set_num_threads(threads)  # every engine (torch and ONNX Runtime) with the same intra-op threads
    try:
        with tempfile.TemporaryDirectory(prefix="overdrive-onnx-") as tmp:  # ORT reads the file at session start
            engines = serving_engines(model.module.eval(), inputs, env, spec=model.spec, dynamic=model.dynamic,
                                      compile=suite.compile, workdir=tmp)
        check_engines(engines, batches)
        measured = measure_service(engines, batches, rounds=suite.serve_rounds, reps=suite.serve_reps,
                                   progress=progress, seed=seed,
                                   min_round_ms=getattr(suite, "serve_min_round_ms", MIN_ROUND_MS))
    finally:
        torch.set_num_threads(was)
    after = load_report()
    res = summarize_serving(measured, engines, slo_ms, seed=seed, loads=(before, after),
                            resamples=getattr(suite, "serve_resamples", RESAMPLES))
    res["model"] = model.description
    res["model_identity"] = model.identity
    res["batches"] = batches
    res["rounds"], res["reps"] = suite.serve_rounds, suite.serve_reps
    res["reps_per_key"] = measured.get("reps_per_key")
    res["threads"], res["threads_why"] = threads, why
    return res


def click_served_model(suite, seed: int = 0):
    """The built-in DLRM click model with the suite's table scale (weights from `seed`), served with bag length 5."""
    import torch

    from overdrive.recsys import DLRM, CriteoSpec
    from overdrive.serve.identity import CLICK_IDENTITY
    from overdrive.serve.served_model import CLICK_DYNAMIC, CLICK_SPEC, ClickServing, ServedModel, click_inputs

    torch.manual_seed(seed)
    base = CriteoSpec()
    spec = CriteoSpec(table_sizes=tuple(max(10, int(n * suite.table_scale)) for n in base.table_sizes))
    return ServedModel(ClickServing(DLRM(spec)).eval(), lambda b: click_inputs(b, 5, seed=seed + b, spec=spec),
                       CLICK_SPEC, CLICK_DYNAMIC,
                       f"DLRM click model, {sum(spec.table_sizes):,} embedding rows, bag length 5",
                       {**CLICK_IDENTITY, "table_scale": suite.table_scale})


def serving_threads(load: dict, default: int) -> tuple[int, str]:
    """Intra-op threads per engine: half the cores the host's load leaves free, at least one
    (measure.threads.plan_threads for the free cores: one engine runs at a time; this process, busy
    while planning, is not counted as another tenant). A p99 judged over thousands of calls counts
    every call whose threads met at an op's barrier while one of them was descheduled, so the tail,
    not the median, decides the thread count: on an idle 2-core host 2 threads gave eager batch-1
    calls p50 0.52 / p99 8.0 ms against 0.55 / 1.1 ms with 1, and at load 18 calls went from 0.3 to
    10 ms. The other half is headroom for the host's own work."""
    cores = int(load.get("cores") or default)
    plan = plan_threads(active=1, cores=min(cores, max(1, default)), load=load.get("load1"), own_running=1)
    threads = max(1, plan.threads // 2)
    how = f"load {load['load1']} on {cores} cores" if load.get("load1") is not None else "load not readable"
    return threads, (f"{threads} ({how}: half the {plan.threads} core(s) the host's other work leaves free, "
                     f"the rest headroom for the p99)")
