"""The measurement core (`overdrive.measure`) is the one worker protocol, launcher and candidate type;
bench and tune are policies over it. A second worker loop, process launcher or candidate class
outside it fails here, and the protocol keeps its contract: error kinds, one-shot commands, a worker
that ends on finish, failure or a closed pipe, a crash and a hang seen by the parent."""

import ast
import os
import signal

import pytest

from overdrive.errors import UserError
from overdrive.measure.worker import LocalConn, Program, Task, classify, user_call, worker_main
from scan import scan

# What starts or serves a worker process: only overdrive.measure may hold any of it.
_LAUNCH_ATTRS = {"get_context", "set_forkserver_preload", "get_all_start_methods", "Pipe", "Process"}


def _worker_machinery(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[-1] == "multiprocessing"]
        elif isinstance(node, ast.ImportFrom) and node.module and "multiprocessing" in node.module.split("."):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and node.attr in _LAUNCH_ATTRS and not (
                isinstance(node.value, ast.Name) and node.value.id == "psutil"):  # psutil.Process reads memory
            found.append(f".{node.attr}")
        elif isinstance(node, ast.While) and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                                 and n.func.attr == "recv" for n in ast.walk(node)):
            found.append("a loop serving recv()")
        elif isinstance(node, ast.ClassDef) and node.name.endswith("Candidate"):
            found.append(f"class {node.name}")
    return found


def test_no_second_worker_protocol_launcher_or_candidate_outside_measure():
    bad, inside = scan(_worker_machinery, inside="measure")
    assert not bad, f"worker machinery outside overdrive.measure (use measure.launch / measure.worker): {bad}"
    # the scan can fail: it sees what the core itself does
    assert {"import multiprocessing", ".get_context", ".set_forkserver_preload", ".Pipe", ".Process",
            "a loop serving recv()", "class Candidate"} <= inside


def test_bench_and_tune_share_one_candidate_type_and_one_protocol():
    from overdrive.bench.suites import Candidate as BenchCandidate
    from overdrive.bench.task import PROGRAM as BENCH
    from overdrive.measure.candidate import Candidate
    from overdrive.tuning.candidates import Candidate as TuneCandidate
    from overdrive.tuning.task import PROGRAM as TUNE

    assert BenchCandidate is Candidate and TuneCandidate is Candidate
    assert isinstance(BENCH, Program) and isinstance(TUNE, Program) and set(TUNE.commands) == {"fp8_filter"}


def test_a_candidate_says_what_ran_with_its_fallback():
    from fakes import machine
    from overdrive.env import build_report
    from overdrive.measure.candidate import Candidate
    from overdrive.recipes import resolve

    cpu = build_report(machine(None))
    c = Candidate.preset("amp-fp16")
    assert c.resolved is None and c.ran(cpu) == "amp-fp16" and not c.emulated
    c.resolved, c.names = resolve(c.recipe, cpu), ["amp-fp16", "fp16"]
    assert c.label == "amp-fp16 = fp16" and c.ran(cpu).startswith("amp-fp16 = fp16")
    assert c.to_dict()["resolved"]["precision"] == c.resolved.precision


# -- the protocol, with a task of the test's own ------------------------------------------------

class _Count:
    """A task without torch: counts its steps, fails on demand the way real code does."""

    def __init__(self, spec):
        if spec.get("user"):
            user_call("the model factory", lambda: 1 / 0)
        if spec.get("refuse"):
            raise UserError("the batch function returned str: return a tensor")
        self.n, self.fail = 0, spec.get("fail")

    def setup_reply(self):
        return {"hello": 1}

    def step(self, k=1):
        if self.fail == "oom":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:116] DefaultCPUAllocator: can't allocate memory")
        if self.fail == "backend":
            raise RuntimeError("inductor lowering failed")
        if self.fail == "hang":
            import time

            time.sleep(60)
        if self.fail == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        self.n += k
        return {"n": self.n}

    def run_reply(self):
        return {"seen": self.n}

    def finish(self):
        return {"memory": {"steps": self.n}}


def _twice(spec):
    return {"twice": 2 * spec["x"]}


PROG = Program(build=_Count, commands={"double": _twice})


def _local(spec):
    c = LocalConn(PROG)
    c.send(("setup", spec))
    return c, c.recv()


def test_setup_run_finish_and_a_one_shot_command():
    c, r = _local({})
    assert r["ok"] and r["hello"] == 1 and r["setup_s"] >= 0
    c.send(("run", 3, 2))  # extra arguments of "run" reach every step
    r = c.recv()
    assert [s["n"] for s in r["steps"]] == [2, 4, 6] and r["seen"] == 6
    c.send(("finish",))
    assert c.recv() == {"ok": True, "memory": {"steps": 6}}
    c = LocalConn(PROG)
    c.send(("double", {"x": 21}))
    assert c.recv() == {"ok": True, "twice": 42}
    c.send(("finish",))  # finish before any setup: nothing to report, no crash
    assert c.recv() == {"ok": True, "memory": None}


@pytest.mark.parametrize("spec,kind,words", [
    ({"user": True}, "user", "the model factory raised ZeroDivisionError: division by zero"),
    ({"refuse": True}, "user", "the batch function returned str: return a tensor"),
])
def test_the_users_own_code_is_reported_as_theirs(spec, kind, words):
    _, r = _local(spec)
    assert r["kind"] == kind and r["error"] == words and "Traceback" in r["trace"]


@pytest.mark.parametrize("fail,kind", [("oom", "oom"), ("backend", "backend")])
def test_a_step_failure_has_its_kind(fail, kind):
    c, _ = _local({"fail": fail})
    c.send(("run", 1))
    r = c.recv()
    assert r["kind"] == kind and r["error"].startswith("RuntimeError: ")
    assert classify(MemoryError()) == "oom" and classify(UserError("x")) == "user"


class _Pipe:
    """A conn that replays messages and records the replies; EOF when it runs out."""

    def __init__(self, *msgs):
        self.msgs, self.sent = list(msgs), []

    def recv(self):
        if not self.msgs:
            raise EOFError
        return self.msgs.pop(0)

    def send(self, reply):
        self.sent.append(reply)


@pytest.mark.parametrize("msgs,replies", [
    ([("setup", {}), ("run", 1), ("finish",), ("run", 1)], 3),  # ends on finish
    ([("double", {"x": 1}), ("setup", {})], 1),  # a one-shot command ends it
    ([("setup", {"fail": "backend"}), ("run", 1), ("run", 1)], 2),  # a failure ends it
    ([("setup", {}), ("run", 1)], 2),  # the parent closed its end: EOF ends it
])
def test_the_worker_loop_ends_when_it_should(msgs, replies, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    conn = _Pipe(*msgs)
    worker_main(conn, PROG, compile_threads=3)
    assert len(conn.sent) == replies
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "3"


def test_the_core_task_sets_threads_env_and_memory_baseline():
    import torch

    from fakes import machine
    from overdrive.env import build_report

    before = torch.get_num_threads()
    try:
        t = Task({"threads": 1, "env_facts": build_report(machine(None)).facts})
        assert torch.get_num_threads() == 1 and t.device == "cpu" and not t.cuda
        assert t.finish()["memory"]["kind"] == "cpu_peak_rss"
    finally:
        torch.set_num_threads(before)


# -- real processes ------------------------------------------------------------------------------

def test_launched_workers_answer_crash_and_hang_as_the_parent_sees_them():
    from overdrive.measure.launch import Failure, Launcher, call_all
    from overdrive.measure.threads import plan_threads

    launcher = Launcher(PROG, plan=plan_threads(active=1, user=1), grace_s=0.5)
    ok, die, hang = (launcher.start(("setup", s)) for s in ({}, {"fail": "die"}, {"fail": "hang"}))
    try:
        assert all(w.receive(60)["ok"] for w in (ok, die, hang))
        r = call_all([ok, die], [("run", 2), ("run", 1)], 60)
        assert [s["n"] for s in r[0]["steps"]] == [1, 2]
        assert r[1] == Failure("crashed", f"worker process died (exit code {-signal.SIGKILL})", -signal.SIGKILL)
        assert die.conn is None and die.call(("run", 1), 1).kind == "crashed"  # stays dead, no exception
        f = hang.call(("run", 1), 0.5)
        assert f.kind == "timeout" and "no answer within" in f.reason and not hang.proc.is_alive()
        assert ok.call(("finish",), 60) == {"ok": True, "memory": {"steps": 2}}
        ok.proc.join(5)
        assert ok.proc.exitcode == 0
    finally:
        for w in (ok, die, hang):
            w.stop(grace_s=0)


def test_the_callers_script_is_not_rerun_unless_a_worker_needs_it(monkeypatch):
    import sys
    import types

    from overdrive.measure.launch import main_not_rerun

    main = types.ModuleType("__main__")
    main.__file__ = "/home/user/train.py"  # a script calling tune() without a __main__ guard
    monkeypatch.setitem(sys.modules, "__main__", main)
    with main_not_rerun([_twice, None]):  # the workers need nothing from the script: hidden while they start
        assert "__file__" not in vars(main)
    assert main.__file__ == "/home/user/train.py"
    in_script = types.FunctionType(_twice.__code__, {}, "make_model")
    in_script.__module__ = "__main__"
    with main_not_rerun([in_script]):  # a function the workers are sent lives there: they must re-import it
        assert main.__file__ == "/home/user/train.py"
