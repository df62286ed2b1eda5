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

    def __init__(self, name: str, noise: float) -> None:
        self.name, self.noise, self.turns, self.conn, self._reply = name, noise, 0, object(), None
        self.speed = SPEED[BASE if name == twin_name(BASE) else name]

    def send(self, msg):
        if msg[0] == "finish":
            self._reply = {"memory": {"peak_mb": 1.0}, "final": None}
            return None
        steps = []
        for i in range(msg[1]):
            ms = self.speed * random.Random(f"{self.name}:{self.turns}:{i}").uniform(1 - self.noise, 1 + self.noise)
            steps.append({"ms": ms, "loss": 2.0, "gnorm": 1.0, "teacher_ms": ms / 2, "student_ms": ms / 2,
                          "teacher_loss": 2.0, "student_loss": 2.0})
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
