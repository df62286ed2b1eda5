"""A bench configuration inside its worker (the protocol and the launcher are the measurement core's,
`overdrive.measure.worker` and `overdrive.measure.launch`): the workload's `Task` for one
configuration, from the workload registry (`overdrive.bench.workloads`), plus what bench adds to it:
- the quality snapshot right after step `parity_steps`, so every configuration is judged at the same
  point of training whatever the time budget let the timed rounds run;
- test-only faults and simulated host load (`inject`: fail_at_step, slow, noise_ms), passed in by
  tests, never read from the environment.
"""

from __future__ import annotations

import random

from overdrive.measure.worker import Program

__all__ = ["Configuration", "PROGRAM"]


class Configuration:
    """What a bench worker runs: `("run", n)` steps the workload's task n times."""

    def __init__(self, spec: dict) -> None:
        from overdrive.bench.workloads import workload_for_task

        self.spec = spec
        # The injected noise (tests) differs per configuration, the A/A twin included: a twin with the
        # baseline's very noise would measure no noise at all.
        self.rng = random.Random(f"{spec.get('seed', 0)}:{spec.get('name', '')}")
        self.task = workload_for_task(spec["task"]).build(spec)
        self.steps = 0
        self.quality: dict | None = None

    def setup_reply(self) -> dict:
        return {"applied": getattr(self.task, "applied", None)}

    def step(self) -> dict:
        inj = self.spec.get("inject") or {}
        if inj.get("fail_at_step") is not None and self.steps >= inj["fail_at_step"]:
            raise RuntimeError("injected backend failure (test)")
        out = self.task.step()
        if inj.get("slow") or inj.get("noise_ms"):
            # Simulated host load (tests): every step time scaled, plus random extra milliseconds. Only
            # the reported times change, never the training, so quality must not move with it.
            for k in [k for k in out if k.endswith("_ms")]:
                out[k] = out[k] * inj.get("slow", 1.0) + self.rng.expovariate(1.0) * inj.get("noise_ms", 0.0)
        self.steps += 1
        if self.steps == self.spec.get("parity_steps"):
            self.quality = self.task.quality()  # judged at the same step for every configuration
        return out

    def run_reply(self) -> dict:
        return {}

    def finish(self) -> dict:
        return {"memory": self.task.memory(), "final": self.quality}


PROGRAM = Program(build=Configuration)
