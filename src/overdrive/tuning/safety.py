"""Is a candidate safe to train with? Judged by the one quality judge of the measurement core
(`overdrive.measure.quality.judge_curve`): its loss curve against the baseline's (plain fp32, same
model, same initial weights, same batches, same seed) within the per-precision tolerance bench uses,
its losses finite, its gradients not blowing up. An unsafe candidate is reported, never picked; a
loss that is never finite fails, the baseline's included.
"""

from __future__ import annotations

from dataclasses import dataclass

from overdrive.measure.quality import GRAD_BLOWUP, LOSS_TOLERANCE, CurveVerdict, judge_curve

__all__ = ["Tolerance", "SafetyResult", "check_safety"]

SafetyResult = CurveVerdict


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    pct: float | None = None
    """Allowed tail-mean loss difference in % of the baseline's; None: bench's per-precision table
    (fp32 1%, bf16/fp16 3%, fp8 5%, fp4 10%), the same verdict in bench and tune."""

    def describe(self) -> str:
        table = ", ".join(f"{k} {100 * v:g}%" for k, v in LOSS_TOLERANCE.items())
        rule = f"{self.pct:g}% for every precision" if self.pct is not None else f"per precision: {table}"
        return (f"tail-mean loss within the baseline's ({rule}), finite, grad norm < {GRAD_BLOWUP:g}x "
                "the baseline's")


def check_safety(loss: list[float], ref_loss: list[float], *, gnorm: list[float | None] | None = None,
                 ref_gnorm: list[float | None] | None = None, scaler: bool = False,
                 tol: Tolerance = Tolerance(), precision: str = "fp32", is_baseline: bool = False) -> SafetyResult:
    return judge_curve(loss, ref_loss, precision=precision, gnorm=gnorm, ref_gnorm=ref_gnorm, scaler=scaler,
                       is_baseline=is_baseline, tol=None if tol.pct is None else tol.pct / 100)
