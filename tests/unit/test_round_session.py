"""The one round driver (`overdrive.measure.session`): bench and tune are configurations of it, so the
same model gets the same verdict from both. Workers are faked: each step's time is a fixed function
of the configuration's name, its turn and the step (no model, no clock), so bench's and tune's use of
the session see the very same timings."""

import random

import pytest
from torch import nn

from fakes import TORCHAO_EMU, machine
from overdrive.bench.analysis import analyze
from overdrive.bench.runner import ConfigRun, Schedule, _timed, _twin_of
from overdrive.bench.suites import Suite
from overdrive.env import build_report
from overdrive.measure.session import RoundsConfig, RoundSession, ci_seed, judge, twin_name
from overdrive.measure.stats import host_too_busy
from overdrive.tuning.api import _row
from overdrive.tuning.candidates import named_candidates
from overdrive.tuning.measure import Run, Session
from overdrive.tuning.workload import Workload

CPU = build_report(machine(None, torchao=TORCHAO_EMU))  # fp8 runs emulated here
BASE = "baseline"
SPEED = {BASE: 100.0, "amp-bf16": 50.0, "fp32": 400.0, "fp8": 300.0}
"""ms per step: a 2x winner, a 4x slower one (stopped early), an emulated format (never timed)."""


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x)


def _batch(step):
    return (None,)


class FakeWorker:
    """The parent's end of a worker that steps at SPEED[name] ms times noise: the k-th turn's steps
    depend only on (name, k, i), so any driver that gives it the same turns sees the same times."""

    def __init__(self, name: str, noise: float, speed: dict | None = None, cpu: float | None = None) -> None:
        self.name, self.noise, self.turns, self.conn, self._reply = name, noise, 0, object(), None
        self.speed = (speed or SPEED)[BASE if name == twin_name(BASE) else name]
        self.cpu = cpu
        """The CPU time of each step (ms), when not the step's own time: a load stretching the wall time."""

    def send(self, msg):
        if msg[0] == "finish":
            self._reply = {"memory": {"peak_mb": 1.0}, "final": None}
            return None
        steps = []
        for i in range(msg[1]):
            ms = self.speed * random.Random(f"{self.name}:{self.turns}:{i}").uniform(1 - self.noise, 1 + self.noise)
            steps.append({"ms": ms, "loss": 2.0, "gnorm": 1.0, "teacher_ms": ms / 2, "student_ms": ms / 2,
                          "teacher_loss": 2.0, "student_loss": 2.0, "cpu_ms": self.cpu or ms})
        self.turns += 1
        self._reply = {"steps": steps}
        return None

    def receive(self, timeout):
        return self._reply

    def call(self, msg, timeout):
        return self.send(msg) or self.receive(timeout)

    def stop(self, grace_s=None):
        self.conn = None


def _noise(name: str, busy: bool) -> float:
    return 0.4 if busy and name in (BASE, twin_name(BASE)) else 0.01


def _bench(cands, busy: bool) -> dict:
    suite = Suite(name="t", teacher="tiny", student="tiny", batch=4, seq=32, warmup=1, rounds=4, min_rounds=4,
                  max_rounds=32, steps_per_round=3, budget_s=600, max_budget_s=600, parity_steps=8, micro="none")
    runs = [ConfigRun(cand=c, resolved=c.resolved.to_dict()) for c in cands]
    for r in runs:
        r.status, r.worker = "pending", FakeWorker(r.cand.name, _noise(r.cand.name, busy))
    twin = _twin_of(runs[0])
    twin.worker = FakeWorker(twin.cand.name, _noise(twin.cand.name, busy))
    sched = Schedule(rounds_planned=4, twin=twin)
    _timed(runs + [twin], runs[0], twin, suite, sched, seed=0, step_timeout=10, tick=lambda d: None, on_look=None)
    res = analyze(runs, suite, CPU, sched)
    return {"verdicts": {c["name"]: c["verdict"] for c in res["configs"] if not c["baseline"]},
            "cmp": {c["name"]: (c["speedup"], c["speedup_ci"], c.get("rounds")) for c in res["configs"]},
            "busy": res["schedule"]["noise"]["too_busy"], "rounds": sched.rounds_run, "status":
            {r.cand.name: r.status for r in runs}}


def _tune(cands, busy: bool) -> dict:
    s = Session(Workload(model_fn=Net, batch_fn=_batch), CPU, budget_s=600)
    s.runs = [Run(cand=c, worker=FakeWorker(c.name, _noise(c.name, busy)), warmup_ms=[500.0, SPEED[c.name]] * 2)
              for c in cands]
    twin = s.runs[0].cand.__class__(**{**vars(s.runs[0].cand), "name": twin_name(BASE)})
    s.twin = Run(cand=twin, worker=FakeWorker(twin.name, _noise(twin.name, busy)), warmup_ms=[500.0, 100.0])
    base = s.runs[0]
    s._timed(base, reserve_s=0.1)
    floor = s.floor(base)
    rows = [_row(r, base, CPU, floor) for r in s.runs]
    return {"verdicts": {r["name"]: r["verdict"] for r in rows[1:]},
            "cmp": {r["name"]: (r["speedup"], r["speedup_ci"], r["rounds"]) for r in rows},
            "busy": host_too_busy(floor), "rounds": s.rounds, "status": {r.cand.name: r.status for r in s.runs}}


@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "busy"])
@pytest.mark.parametrize("rival", ["amp-bf16", "fp32"])
def test_bench_and_tune_give_the_same_verdict_on_the_same_workers(rival, busy):
    # One rival beside the baseline, its twin and an emulated format: tune's successive halving (its
    # own question, which one wins) has nothing to halve, so both measure the very same rounds.
    cands = named_candidates([rival, "fp8"], CPU)
    assert [c.name for c in cands] == [BASE, rival, "fp8"] and cands[2].emulated
    b, t = _bench(cands, busy), _tune(cands, busy)
    # Same rounds, same early stop, same floor: the same verdict, speedup and interval.
    assert b["rounds"] == t["rounds"] and b["busy"] == t["busy"] == busy
    assert b["status"][rival] == t["status"][rival]
    assert b["cmp"][rival] == t["cmp"][rival] and b["verdicts"][rival] == t["verdicts"][rival]
    # 2x faster is called even beside a busy host's noise (±40% a step here); 4x slower is stopped after 3
    # rounds on a quiet host, later on a busy one, in both.
    assert b["verdicts"][rival] == ("faster" if rival == "amp-bf16" else "slower")
    assert (b["status"][rival] == "stopped") == (rival == "fp32")
    if rival == "fp32" and not busy:
        assert b["cmp"][rival][2] == 3
    if rival == "amp-bf16":  # quiet: settled at the first look; busy: the A/A floor never narrows enough
        assert b["rounds"] == (32 if busy else 4)
    # An emulated format takes no timed turn in either: its speed is no result.
    assert b["cmp"]["fp8"][:2] == t["cmp"]["fp8"][:2] == (None, None)
    assert b["verdicts"]["fp8"] is None and t["verdicts"]["fp8"] == "emulated"


class _C:
    """A bare contender for the driver alone."""

    def __init__(self, name: str, emulated: bool = False) -> None:
        self.name, self.emulated, self.rounds_ms, self.alive = name, emulated, [], True

    @property
    def live(self) -> bool:
        return self.alive


def _drive(speed: dict, cfg: RoundsConfig, *, twin: bool = True, seconds_per_turn: float = 0.0):
    runs = {n: _C(n, emulated=n.startswith("emu")) for n in speed}
    t = _C(twin_name("base")) if twin else None
    now = [0.0]

    def turn(run, k):
        now[0] += seconds_per_turn
        s = speed.get(run.name, speed["base"])
        return [s * random.Random(f"{run.name}:{k}:{i}").uniform(0.99, 1.01) for i in range(3)]

    stopped = {}

    def stop(run, why):
        run.alive, stopped[run.name] = False, why

    s = RoundSession(baseline=runs["base"], twin=t, contenders=[*runs.values(), *([t] if t else [])], turn=turn,
                     stop=stop, config=cfg, clock=lambda: now[0])
    s.run()
    return s, runs, stopped


def test_the_driver_stops_a_slow_one_at_the_end_of_a_round_on_its_own_seed():
    s, runs, stopped = _drive({"base": 10.0, "slow": 50.0, "emu": 500.0}, RoundsConfig(looks=(4, 8)))
    assert set(stopped) == {"slow"} and "over 3 paired rounds" in stopped["slow"]
    assert len(runs["slow"].rounds_ms) == 3 and not runs["emu"].rounds_ms  # the emulated one never took a turn
    assert s.rounds == 4 and s.stop_reason.startswith("no configuration left")
    c = s.verdict(runs["slow"])
    assert c.verdict == "slower" and c == judge(runs["base"], runs["slow"], s.floor(), looks=2)
    assert ci_seed("slow") != ci_seed("base")


def test_the_driver_measures_on_within_its_bound_and_says_why_it_stopped():
    # No twin: no floor, so no look can settle; the time bound ends the rounds (never below min_rounds).
    cfg = RoundsConfig.within(max_rounds=32, max_s=10.0, min_rounds=2, bound_text="the budget (10 s)")
    assert cfg.looks == (4, 8, 16, 32)
    s, _, _ = _drive({"base": 10.0, "fast": 5.0}, cfg, twin=False, seconds_per_turn=0.5)
    assert s.rounds == 10 and s.stop_reason == "the budget (10 s) after 10 rounds"
    # With stop_at_look, the rounds end at the last look the bound can reach.
    cfg = RoundsConfig(looks=(4, 8, 16, 32), max_s=10.0, stop_at_look=True, bound_text="the cap (10 s)")
    s, _, _ = _drive({"base": 10.0, "fast": 5.0}, cfg, twin=False, seconds_per_turn=0.5)
    assert s.rounds == 8 and s.stop_reason.startswith("the cap (10 s): 16 rounds would not fit")
    # With the twin, a clear winner settles at the first look; "leader" names it.
    s, _, _ = _drive({"base": 10.0, "fast": 5.0, "mid": 8.0}, RoundsConfig(looks=(4, 8), settle="leader"))
    assert s.rounds == 4 and s.stop_reason.endswith("leader fast") and not s.too_busy()


# -- stopped after warm-up: the shared rule (`measure.session.warmup_stop`) in bench and tune ---------------------

WARM_SPEED = {BASE: 100.0, "amp-fp16": 2000.0, "fp32": 200.0, "amp-bf16": 1200.0}
"""ms per step: 20x slower (fp16 on a CPU without fp16 units), 2x slower, 12x slower."""


def _bench_warm(cands, busy: bool, cpu: dict | None = None):
    """Bench's warm-up (first step together, then interleaved steps), its timed rounds, the analysis.
    `cpu`: name -> the CPU time of its steps, where a load stretches their wall time."""
    from overdrive.bench.runner import _warm_up

    suite = Suite(name="t", teacher="tiny", student="tiny", batch=4, seq=32, warmup=3, rounds=4, min_rounds=4,
                  max_rounds=8, steps_per_round=3, budget_s=600, max_budget_s=600, parity_steps=8, micro="none")
    runs = [ConfigRun(cand=c, resolved=c.resolved.to_dict()) for c in cands]
    twin = _twin_of(runs[0])
    for r in runs + [twin]:
        r.worker = FakeWorker(r.cand.name, _noise(r.cand.name, busy), WARM_SPEED, (cpu or {}).get(r.cand.name))
    every = runs + [twin]
    _warm_up(every, runs[0], suite, 10, lambda d: None, seed=0)
    stopped_before_timing = {r.cand.name: (r.status, len(r.warmup_ms)) for r in runs if r.status == "stopped"}
    sched = Schedule(rounds_planned=4, twin=twin)
    _timed(every, runs[0], twin, suite, sched, seed=0, step_timeout=10, tick=lambda d: None, on_look=None)
    for r in runs:
        r.status = "ok" if r.status == "pending" else r.status
    return runs, analyze(runs, suite, CPU, sched), stopped_before_timing


@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "busy"])
def test_bench_stops_a_contender_far_slower_in_its_warm_up_before_any_timed_round(busy):
    import io

    from rich.console import Console

    from overdrive.report.tables import render_bench

    cands = named_candidates(["amp-fp16", "fp32"], CPU)
    runs, res, early = _bench_warm(cands, busy)
    res = {**res, "device": "CPU", "suite": {"name": "t", "teacher": "tiny", "student": "tiny", "batch": 4, "seq": 32}}
    fp16 = next(r for r in runs if r.cand.name == "amp-fp16")
    # 20x slower on every warm-up step: stopped after its 3 warm-up steps, never timed.
    assert early == {"amp-fp16": ("stopped", 3)}
    assert fp16.stopped_at == "warm-up" and not fp16.rounds_ms and not fp16.ms["teacher"]
    ratio = "20x" if not busy else "22x"  # busy: the baseline's warm-up steps drew -10% from its ±40% noise
    assert fp16.reason.startswith(f"stopped after warm-up: {ratio} slower than the baseline (fp32) in its warm-up "
                                  "steps")
    assert "not timed; quality not assessed" in fp16.reason
    # 2x slower (even beside a busy host's ±40% on the baseline): timed, judged slower, never stopped.
    c = {x["name"]: x for x in res["configs"]}
    assert c["fp32"]["status"] == "ok" and c["fp32"]["stopped_at"] is None and c["fp32"]["verdict"] == "slower"
    assert c["fp32"]["rounds"] >= 4
    # The JSON: its own label, no speed, no verdict, quality not assessed, never recommended.
    j = c["amp-fp16"]
    assert j["status"] == "stopped" and j["stopped_at"] == "warm-up" and j["reason"] == fp16.reason
    assert j["verdict"] is None and j["speedup"] is None and j["rounds"] == 0 and j["safe"] is None
    assert res["recommendation"]["name"] != "amp-fp16" and "amp-fp16" not in res["recommendation"]["text"]
    # The baseline and its twin had every round the stopped one did not take.
    assert res["schedule"]["rounds_run"] == len(runs[0].rounds_ms) >= 4
    assert j["raw"]["warmup_cpu_ms"] == fp16.warmup_cpu_ms and len(j["raw"]["warmup_cpu_ms"]) == 3
    # The table says so in the speed column, and the note under it gives the ratio.
    buf = io.StringIO()
    render_bench(res, Console(file=buf, width=250, color_system=None, force_terminal=False))
    text = buf.getvalue()
    row = next(line for line in text.splitlines() if line.lstrip("│┃ ").startswith("amp-fp16"))
    assert f"stopped after warm-up ({ratio} slower)" in " ".join(text.split()) and "stopped early" not in row
    assert j["warmup_slowdown"] == pytest.approx(int(ratio[:-1]), abs=0.5)
    # What `overdrive doctor` says of it afterwards (the bench's findings): the same words, once.
    from overdrive.bench.findings import findings_lines

    line = next(x for x in findings_lines(res) if x.startswith("amp-fp16"))
    assert line.startswith(f"amp-fp16 (fp16): stopped after warm-up: {ratio} slower") and "stopped —" not in line
    assert f"note: amp-fp16: stopped after warm-up: {ratio} slower than the baseline (fp32)" in " ".join(text.split())


def test_the_warm_up_rule_needs_every_step_beyond_the_baselines_slowest_in_wall_and_cpu_time():
    from overdrive.measure.session import GROSS_SLOWDOWN, warmup_slowdown, warmup_stop

    assert GROSS_SLOWDOWN == 5.0

    def stop(b, c, bc=None, cc=None):
        return warmup_stop(b, c, base_cpu_ms=b if bc is None else bc, run_cpu_ms=c if cc is None else cc)

    assert stop([100, 102, 99, 101], [2000, 2100]).startswith("stopped after warm-up: 20x slower")
    # The figure it names is the one a stopped run reports (bench's JSON `warmup_slowdown`): medians' ratio.
    assert warmup_slowdown([100, 102, 99, 101], [2000, 2100]) == pytest.approx(2050 / 100.5)
    # One slow baseline step (a moment of load) beside them: its slowest is what the contender must beat.
    assert stop([100, 450, 99, 101], [2000, 2100]) is None
    # One fast contender step: not every step is 5x. 4x slower on every step: left to the timed rounds.
    assert stop([100, 102], [2000, 400]) is None and stop([100, 100], [400, 400]) is None
    # One step a side is one moment: never enough.
    assert stop([100], [5000]) is None and stop([100, 100], [5000]) is None
    # 20x in wall time but the same work (CPU time): a load stretched its steps, not stopped; without CPU
    # times there is no evidence at all.
    assert stop([100, 100], [2000, 2000], cc=[110, 120]) is None
    assert warmup_stop([100, 100], [2000, 2000]) is None
    # And the other way round: 20x the CPU time but 4x the wall time (its work spread over more threads).
    assert stop([100, 100], [400, 400], cc=[2000, 2000]) is None


def test_tune_stops_the_same_contender_on_the_same_rule_in_its_warm_up():
    # Tune warms up one contender at a time, then steps the baseline back to back with it: the same rule
    # (`warmup_stop`) on the same fake workers gives the same stop and the same words as bench.
    cands = named_candidates(["amp-bf16", "fp32"], CPU)
    s = Session(Workload(model_fn=Net, batch_fn=_batch), CPU, budget_s=600)
    s.runs = [Run(cand=c, worker=FakeWorker(c.name, 0.01, WARM_SPEED)) for c in cands]
    base = s.runs[0]
    s._warm(base, None)
    for r in s.runs[1:]:
        s._warm(r, base)
    st = {r.cand.name: r for r in s.runs}
    # 12x slower: under tune's first-step cut (15x), so the warm-up rule is what stops it, before any round.
    # (bf16 on the AVX2 host, one thread: 12x.)
    assert st["amp-bf16"].status == "stopped" and not st["amp-bf16"].ms
    assert st["amp-bf16"].reason.startswith("stopped after warm-up: 12x slower than the baseline in its warm-up steps")
    assert st["fp32"].status == "pending"  # 2x slower: on to the timed rounds
    runs, _, early = _bench_warm(cands, busy=False)
    assert early == {"amp-bf16": ("stopped", 3)}
    assert next(r for r in runs if r.cand.name == "fp32").stopped_at is None


def test_a_load_that_stretches_a_contenders_warm_up_does_not_stop_it():
    # 20x in wall time on every warm-up step, but its CPU time is the baseline's: the same work, stretched
    # by another tenant's load (what a load of 5-20 timed against one worker did on a 2-core host). Not
    # stopped on its warm-up: the timed rounds judge it (here still 20x: the 3-round rule stops it there).
    cands = named_candidates(["amp-fp16"], CPU)
    runs, res, early = _bench_warm(cands, busy=False, cpu={"amp-fp16": 100.0})
    assert early == {} and runs[1].stopped_at == "rounds" and len(runs[1].rounds_ms) == 3
    assert "over 3 paired rounds" in runs[1].reason
