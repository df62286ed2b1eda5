"""Is a candidate safe to train with? Its loss curve against the fp32 shadow run (the baseline:
same model, same initial weights, same batches, same seed), its losses finite, its gradients
not blowing up. An unsafe candidate is reported, never picked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Tolerance", "SafetyResult", "check_safety"]


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    pct: float = 3.0
    """Allowed mean loss difference over the final window, in % of the fp32 shadow's loss..."""
    nats: float = 0.05
    """...and in absolute loss units (nats for a cross-entropy): unsafe only beyond both, so a loss
    near zero is not failed on a tiny absolute wobble, nor a large loss on a 0.05 nat one."""
    window: int = 5
    """The last `window` common steps are averaged (late divergence is what matters)."""
    grad_blowup: float = 10.0
    """A gradient norm this many times the shadow's at the same step is a blow-up."""

    def describe(self) -> str:
        return (f"loss within {self.pct:g}% or {self.nats:g} nats of the fp32 shadow (mean of the last "
                f"{self.window} common steps), finite, grad norm < {self.grad_blowup:g}x the shadow's")


@dataclass(frozen=True, kw_only=True)
class SafetyResult:
    safe: bool | None
    """None: not checked (too few steps)."""
    reason: str
    steps: int
    delta_pct: float | None = None
    delta_nats: float | None = None


def check_safety(loss: list[float], ref_loss: list[float], *, gnorm: list[float | None] | None = None,
                 ref_gnorm: list[float | None] | None = None, scaler: bool = False,
                 tol: Tolerance = Tolerance()) -> SafetyResult:
    n = min(len(loss), len(ref_loss))
    bad = [i for i, v in enumerate(loss) if not math.isfinite(v)]
    if bad:
        return SafetyResult(safe=False, reason=f"loss is {loss[bad[0]]} at step {bad[0]}", steps=len(loss))
    if n < 2:
        return SafetyResult(safe=None, reason=f"only {n} step(s) to compare with the fp32 shadow", steps=n)
    w = min(tol.window, n)
    a, b = loss[n - w:n], ref_loss[n - w:n]
    d_nats = sum(x - y for x, y in zip(a, b)) / w
    ref_mean = sum(b) / w
    d_pct = 100.0 * d_nats / abs(ref_mean) if ref_mean else math.inf
    if gnorm and ref_gnorm:
        for i, (g, r) in enumerate(zip(gnorm, ref_gnorm)):
            if g is None or r is None:
                continue
            if not math.isfinite(g):
                if scaler:  # GradScaler skips such steps on purpose while it finds its scale
                    continue
                return SafetyResult(safe=False, reason=f"gradient norm is {g} at step {i}", steps=n,
                                    delta_pct=d_pct, delta_nats=d_nats)
            if math.isfinite(r) and g > tol.grad_blowup * max(r, 1e-12):
                return SafetyResult(safe=False, reason=f"gradient norm blew up at step {i}: {g:.3g} vs "
                                    f"{r:.3g} in fp32 ({g / max(r, 1e-12):.0f}x)", steps=n,
                                    delta_pct=d_pct, delta_nats=d_nats)
    if abs(d_pct) > tol.pct and abs(d_nats) > tol.nats:
        return SafetyResult(safe=False, reason=f"loss drifts from the fp32 shadow by {d_pct:+.2f}% "
                            f"({d_nats:+.4f} nats) over steps {n - w}-{n - 1}: beyond {tol.pct:g}% and "
                            f"{tol.nats:g} nats", steps=n, delta_pct=d_pct, delta_nats=d_nats)
    return SafetyResult(safe=True, reason=f"loss within tolerance of fp32 over {n} steps ({d_pct:+.2f}%, "
                        f"{d_nats:+.4f} nats)", steps=n, delta_pct=d_pct, delta_nats=d_nats)
