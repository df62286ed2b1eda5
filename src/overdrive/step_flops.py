"""Achieved TFLOP/s and MFU for `accelerate()`'d training loops, on the user's own model.

The FLOPs come from `torch.utils.flop_counter.FlopCounterMode` (matmuls, convolutions and attention;
the MFU convention, see `measure.flop_count`) over the user's first micro-step, in two parts, and the
counter is on only inside them, never across the user's own code: the model's first forward (entered by
a forward pre-hook, left by a forward hook that runs even when the forward raises) and, when the user
calls `acc.backward`, that backward. A dispatch mode left on would follow every op of the process
(inference, other models, torch.compile's tracing) until some later call. Where another caller runs the
backward (the HF Trainer calls its own), it is taken as twice the forward (the 6N convention's 2:4) and
the note says so. The time is taken at each optimizer step (CUDA events on a GPU: no sync in the loop),
from the end of the first step, which carries compilation and the count itself, to the last.
"""

from __future__ import annotations

import contextlib
import time

from torch import nn

__all__ = ["StepFlops"]


class StepFlops:
    def __init__(self, model: nn.Module, *, device, enabled: bool = True) -> None:
        self.device = device
        self.flops: int | None = None
        """FLOPs of one micro-step (None until counted)."""
        self.note = "" if enabled else "not counted (distributed: each rank counts only its shard)"
        self._mode = None
        self._forward: int | None = None
        """The first forward's FLOPs, once it returned (until the backward is counted)."""
        self._first = None  # the end of the first optimizer step: a time, or a CUDA event
        self._last = None
        self._steps = 0
        self._handles = [model.register_forward_pre_hook(self._pre),
                         model.register_forward_hook(self._post, always_call=True)] if enabled else []

    def _pre(self, module, args) -> None:
        if self._forward is not None:  # a second forward before acc.backward: another caller ran the backward
            self._settle(self._forward * 3, "first micro-step's forward counted; its backward (run by another "
                                            "caller) taken as twice the forward")
        elif self._mode is None:
            from overdrive.measure.flop_count import flop_counter

            self._mode = flop_counter()
            self._mode.__enter__()

    def _post(self, module, args, output) -> None:
        if self._mode is not None:  # also when the forward raised (always_call): never left on
            self._mode.__exit__(None, None, None)
            self._forward = int(self._mode.get_total_flops())
            self._mode = None

    @contextlib.contextmanager
    def backward(self):
        """Around `acc.backward`'s backward: counts it when it is the first micro-step's."""
        if self._forward is None or self.flops is not None:
            yield
            return
        from overdrive.measure.flop_count import flop_counter

        with flop_counter() as mode:
            yield
        self._settle(self._forward + int(mode.get_total_flops()), "forward and backward of the first micro-step")

    def _settle(self, total: int, note: str) -> None:
        self.flops = total or None
        self.note = note if total else "not counted: no matmul, convolution or attention in the step"
        self._forward = None
        self.finish()

    def finish(self, note: str = "") -> None:
        """Stop counting (hooks removed; a counter still on, which cannot happen after a forward, is left)."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for h in self._handles:
            h.remove()
        self._handles = []

    def mark_step(self) -> None:
        """The end of an optimizer step."""
        if self.device.type == "cuda":
            import torch

            mark = torch.cuda.Event(enable_timing=True)
            mark.record()
        else:
            mark = time.perf_counter()
        if self._first is None:
            self._first = mark
        else:
            self._last = mark
            self._steps += 1

    def _seconds(self) -> float | None:
        if self._last is None:
            return None
        if self.device.type == "cuda":
            self._last.synchronize()
            return self._first.elapsed_time(self._last) / 1e3
        return self._last - self._first

    def report(self, *, accum: int, precision: str, emulated: bool) -> dict:
        """{"flops_per_step", "steps_timed", "tflops", "mfu", "mfu_peak", "mfu_bf16_peak", "note"}."""
        from overdrive.measure.flop_count import rates

        per_step = self.flops * accum if self.flops else None
        s = self._seconds()
        ms = 1e3 * s / self._steps if s and self._steps else None
        spec = None
        if self.device.type == "cuda":
            import torch

            from overdrive.env.catalog import lookup_gpu

            spec = lookup_gpu(torch.cuda.get_device_name(self.device))
        out = {"flops_per_step": per_step, "steps_timed": self._steps, "step_ms": ms, "note": self.note}
        out.update(rates(per_step, ms, precision=precision, spec=spec, emulated=emulated))
        return out

    def line(self, *, accum: int, precision: str, emulated: bool) -> str:
        r = self.report(accum=accum, precision=precision, emulated=emulated)
        if not r["flops_per_step"]:
            return f"  FLOPs: {r['note'] or 'not counted yet (no forward has run)'}"
        s = (f"  FLOPs: {r['flops_per_step'] / 1e9:.3g} GFLOP per optimizer step (FlopCounterMode on your first "
             f"micro-step" + (f" x {accum} micro-steps" if accum > 1 else "") + ")")
        if r["tflops"] is None:
            return s + "; achieved TFLOP/s after two optimizer steps"
        s += f"; achieved {r['tflops']:.3g} TFLOP/s over {r['steps_timed']} steps"
        if r["mfu"] is not None:
            s += f", MFU {100 * r['mfu']:.1f}% of {r['mfu_peak']}"
        elif emulated:
            s += " (emulated: no MFU)"
        return s
