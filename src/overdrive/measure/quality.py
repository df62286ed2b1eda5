"""The one quality judge: is a configuration's loss curve close enough to the baseline's (plain
fp32, same model, same batches, same seed)? Per-precision tolerances, the same verdict in bench
and tune; a loss that is never finite is a failure, never "safe".
"""

from __future__ import annotations

import math

from overdrive.formats import HIGH_PRECISION_TOLERANCE, format_of, loss_tolerance

__all__ = ["LOSS_TOLERANCE", "loss_tolerance", "tolerance_key", "loss_parity", "judge_curve", "CurveVerdict",
           "GRAD_BLOWUP"]

# Tail-mean loss relative difference vs the baseline (same data order, same seed) beyond which a
# recipe is flagged unsafe: each high precision's and each low-precision format's own
# (`overdrive.formats`: `Format.loss_tolerance`, with its reason). A bare "fp8"/"fp4" gets the
# strictest format of those bits; anything else is an error, never some other precision's allowance.
LOSS_TOLERANCE = {**HIGH_PRECISION_TOLERANCE, **{b: loss_tolerance(b) for b in ("fp8", "fp4")}}
"""What reports print as the table (the formats' own tolerances: `formats.FORMATS`)."""


def tolerance_key(precision: str | None, fp8_scaling: str | None = None) -> str:
    """What to judge a run by: the format that ran (its own tolerance), else the precision."""
    f = format_of(precision, fp8_scaling)
    return f.name if f is not None else str(precision)


def _updates_before(skipped: list[bool]) -> list[int]:
    """Optimizer updates applied before each step: step i follows i updates minus the skipped ones."""
    out, u = [], 0
    for s in skipped:
        out.append(u)
        u += 0 if s else 1
    return out


def loss_parity(losses: list[float], skipped: list[bool], base_losses: list[float], base_skipped: list[bool],
                *, steps: int, precision: str) -> dict:
    """Compare the first `steps` losses with the baseline's, on the tail of the curves.

    Each loss is paired with the baseline's loss after the same number of optimizer updates (a
    GradScaler-skipped step would otherwise make the run lag one step behind on a falling curve),
    and the tail (last quarter, at least 3 points) is averaged on both sides: one noisy point
    never decides. Fewer than `steps` losses on either side: not assessed.
    """
    cand = losses[:steps]
    if not cand and not base_losses and find_tolerance(precision) is None:
        # Nothing to judge (a run that failed before it resolved): no tolerance to state.
        return {"final_loss": None, "loss_delta_pct": None, "unsafe_reason": None, "loss_tolerance_pct": None,
                "parity_steps": steps, "skipped_steps": 0, "assessed": False}
    tol = loss_tolerance(precision)
    out = {"final_loss": None, "loss_delta_pct": None, "unsafe_reason": None, "loss_tolerance_pct": 100 * tol,
           "parity_steps": steps, "skipped_steps": sum(bool(s) for s in skipped[:steps]), "assessed": False}
    cs = (list(skipped) + [False] * steps)[:len(losses[:steps])]
    if any(not math.isfinite(v) for v in cand):
        out.update(assessed=True, unsafe_reason="loss became NaN/inf")
        return out
    if len(cand) < steps or len(base_losses) < steps:
        return out
    bs = (list(base_skipped) + [False] * steps)[:steps]
    base_at: dict[int, float] = {}
    for u, v in zip(_updates_before(bs), base_losses[:steps]):
        base_at.setdefault(u, v)
    pairs = [(v, base_at[u]) for u, v in zip(_updates_before(cs), cand) if u in base_at]
    tail = pairs[-max(3, steps // 4):]
    final = sum(p[0] for p in tail) / len(tail)
    ref = sum(p[1] for p in tail) / len(tail)
    delta = (final - ref) / abs(ref)
    out.update(final_loss=final, baseline_loss=ref, loss_delta_pct=100 * delta, assessed=True,
               tail_steps=len(tail))
    if abs(delta) > tol:
        skips = f", {out['skipped_steps']} skipped steps aligned" if out["skipped_steps"] else ""
        out["unsafe_reason"] = (f"loss over the last {len(tail)} of {steps} steps {final:.3f} vs baseline {ref:.3f} "
                                f"({100 * delta:+.1f}%, tolerance ±{100 * tol:.0f}% for {precision}{skips})")
    return out


def find_tolerance(precision: str) -> float | None:
    """`loss_tolerance`, or None for a precision it does not know."""
    try:
        return loss_tolerance(precision)
    except ValueError:
        return None


GRAD_BLOWUP = 10.0
"""A gradient norm this many times the baseline's at the same step is a blow-up."""


class CurveVerdict:
    """safe: True / False / None (not judged: too few steps); reason; the tail's relative and
    absolute loss difference."""

    def __init__(self, safe: bool | None, reason: str, steps: int, delta_pct: float | None = None,
                 delta_nats: float | None = None) -> None:
        self.safe, self.reason, self.steps, self.delta_pct, self.delta_nats = safe, reason, steps, delta_pct, delta_nats


def judge_curve(loss: list[float], ref_loss: list[float], *, precision: str, gnorm: list[float | None] | None = None,
                ref_gnorm: list[float | None] | None = None, scaler: bool = False, is_baseline: bool = False,
                tol: float | None = None) -> CurveVerdict:
    """The loss curve of one configuration against the baseline's, with the per-precision tolerance
    of `loss_parity` (or `tol`, a relative tolerance). The baseline itself is judged for finiteness
    only: a loss that is never (or not always) finite fails it, so it is never "safe"."""
    bad = [i for i, v in enumerate(loss) if not math.isfinite(v)]
    if bad:
        never = len(bad) == len(loss)
        return CurveVerdict(False, f"loss is {loss[bad[0]]} at step {bad[0]}" + (
            f" (never finite in {len(loss)} steps)" if never else ""), len(loss))
    if is_baseline:
        return CurveVerdict(True if loss else None, "the baseline itself (loss finite)" if loss else "no steps", len(loss),
                            0.0, 0.0)
    n = min(len(loss), len(ref_loss))
    if n < 2:
        return CurveVerdict(None, f"only {n} step(s) to compare with the baseline", n)
    if any(not math.isfinite(v) for v in ref_loss[:n]):
        return CurveVerdict(None, "the baseline's loss is not finite: nothing to compare with", n)
    t = loss_tolerance(precision) if tol is None else tol
    if gnorm and ref_gnorm:
        for i, (g, r) in enumerate(zip(gnorm, ref_gnorm)):
            if g is None or r is None:
                continue
            if not math.isfinite(g):
                if scaler:  # GradScaler skips such steps on purpose while it finds its scale
                    continue
                return CurveVerdict(False, f"gradient norm is {g} at step {i}", n)
            if math.isfinite(r) and g > GRAD_BLOWUP * max(r, 1e-12):
                return CurveVerdict(False, f"gradient norm blew up at step {i}: {g:.3g} vs {r:.3g} in fp32 "
                                    f"({g / max(r, 1e-12):.0f}x)", n)
    w = max(3, n // 4) if n >= 3 else n
    a, b = loss[n - w:n], ref_loss[n - w:n]
    d_nats = sum(x - y for x, y in zip(a, b)) / w
    ref_mean = sum(b) / w
    d = d_nats / abs(ref_mean) if ref_mean else math.inf
    if abs(d) > t:
        return CurveVerdict(False, f"loss over the last {w} of {n} steps differs from the baseline's by {100 * d:+.2f}% "
                            f"({d_nats:+.4f} nats): beyond ±{100 * t:.0f}% for {precision}", n, 100 * d, d_nats)
    return CurveVerdict(True, f"loss within ±{100 * t:.0f}% ({precision}) of the baseline over {n} steps "
                        f"({100 * d:+.2f}%, {d_nats:+.4f} nats)", n, 100 * d, d_nats)
