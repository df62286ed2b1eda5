"""Experiment trackers through their own libraries: TensorBoard, MLflow, Weights & Biases.

    trk = open_trackers("mlflow,wandb", out_dir="runs/x", run_name="x", params={"recipe": {...}})
    trk.log({"loss": 2.31, "step_ms": 41.0, "tokens_per_s": 12_400.0}, step=10)
    trk.close()

`train`, `bench` and `tune` take `--report-to`; `accelerate(..., report_to=...)` gives `acc.log`.
Params are the recipe that ran and the machine's fingerprint; metrics go per step.
Where each tracker writes, and why there, is said once (`Trackers.where`):
- MLflow: MLFLOW_TRACKING_URI when set (a server, `sqlite:///...` with the full mlflow), else a local file
  store in the output folder. MLflow 3 keeps its file store only behind MLFLOW_ALLOW_FILE_STORE=true,
  which is set for this process (said so); `mlflow ui --backend-store-uri DIR/mlruns` reads it.
- W&B: WANDB_MODE when set; otherwise online when an API key is configured (WANDB_API_KEY or
  ~/.netrc), else offline in the output folder (`wandb sync DIR/wandb/offline-run-*` uploads it later).
- TensorBoard: `torch.utils.tensorboard.SummaryWriter` in DIR/tb.
A tracker whose package is missing is refused before anything runs, in one line naming the extra.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time

from overdrive.errors import UserError

__all__ = ["TRACKERS", "parse_report_to", "open_trackers", "Trackers", "flat_params", "machine_params",
           "accelerate_trackers", "train_params", "report_results"]

TRACKERS = ("tensorboard", "mlflow", "wandb")
_NEEDS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow-skinny"),
          "wandb": ("wandb", "wandb")}
"""tracker -> (the module it imports, the pip package that brings it)."""


def parse_report_to(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """"mlflow,wandb" or ["mlflow"] -> the tracker names, checked; "none" or empty -> []."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = []
    for n in (str(x).strip().lower() for x in items):
        if not n or n == "none":
            continue
        if n not in TRACKERS:
            raise UserError(f"--report-to {n!r}: trackers are {', '.join(TRACKERS)} (comma-separated)")
        if n not in names:
            names.append(n)
    for n in names:
        mod, pkg = _NEEDS[n]
        if importlib.util.find_spec(mod) is None:
            raise UserError(f"--report-to {n}: the {pkg} package is not installed: pip install {pkg} "
                            "(the overdrive[trackers] extra)")
    return names


def flat_params(d: dict, prefix: str = "") -> dict[str, str]:
    """{"recipe": {"precision": "bf16"}} -> {"recipe.precision": "bf16"}: MLflow params are flat strings."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_params(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


def metric_key(name: str) -> str:
    """A key every tracker takes (MLflow allows letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^A-Za-z0-9_./ -]", "_", name)


def _numbers(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item") and callable(v.item):  # a tensor: one host sync, at the caller's log call
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[metric_key(k)] = float(v)
    return out


class _TensorBoard:
    def __init__(self, out_dir: str, run_name: str, params: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = os.path.join(out_dir, "tb")
        self.w = SummaryWriter(self.path)
        self.w.add_text("params", "\n".join(f"    {k} = {v}" for k, v in flat_params(params).items()))
        self.where = f"TensorBoard: {self.path} (tensorboard --logdir {self.path})"

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.w.add_scalar(k, v, step)

    def close(self, ok: bool) -> None:
        self.w.close()


class _MLflow:
    def __init__(self, out_dir: str, run_name: str, params: dict) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        note = ""
        if not uri:
            uri = "file:" + os.path.abspath(os.path.join(out_dir, "mlruns"))
            if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true":
                os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses its file store otherwise
                note = " (local file store: MLFLOW_ALLOW_FILE_STORE=true set for this run)"
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "overdrive")
        exp = self.client.get_experiment_by_name(name)
        eid = exp.experiment_id if exp else self.client.create_experiment(name)
        self.run_id = self.client.create_run(eid, run_name=run_name).info.run_id
        # MLflow caps a param value at 6000 characters: longer ones are cut, and say so
        ps = [Param(k[:250], v if len(v) <= 6000 else v[:5980] + "...(truncated)")
              for k, v in flat_params(params).items()]
        for i in range(0, len(ps), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(self.run_id, params=ps[i:i + 100])
        self.uri = uri
        self.where = f"MLflow: run {self.run_id} in experiment {name!r} at {uri}{note}"

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, v, ts, int(step)) for k, v in metrics.items()]
        for i in range(0, len(ms), 1000):
            self.client.log_batch(self.run_id, metrics=ms[i:i + 1000])

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class _WandB:
    def __init__(self, out_dir: str, run_name: str, params: dict) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE")
        note = ""
        if not mode:
            mode = "online" if _wandb_logged_in() else "offline"
            if mode == "offline":
                note = " (offline: no W&B API key here; `wandb sync` uploads it)"
        os.makedirs(out_dir, exist_ok=True)
        # reinit="create_new" (wandb >= 0.19.10): a run of its own even when the user has one open
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "overdrive"), name=run_name, config=params,
                              mode=mode, dir=out_dir, reinit="create_new")
        self.where = f"W&B ({mode}): run {self.run.id} in {self.run.dir}{note}"

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=int(step))

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


_OPEN = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}


class Trackers:
    """The trackers of one run; `log` sends the numbers of a dict (tensors read once) at a step."""

    def __init__(self, trackers: list) -> None:
        self.trackers = trackers
        self.where = [t.where for t in trackers]
        self._last_step = -1

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log(self, metrics: dict, step: int | None = None) -> None:
        step = self._last_step + 1 if step is None else int(step)
        self._last_step = max(self._last_step, step)
        nums = _numbers(metrics)
        if nums:
            for t in self.trackers:
                t.log(nums, step)

    def close(self, ok: bool = True) -> None:
        for t in self.trackers:
            t.close(ok)
        self.trackers = []


def open_trackers(report_to, *, out_dir: str, run_name: str | None = None, params: dict | None = None,
                  main_process: bool = True) -> Trackers:
    """Start a run in each tracker named (none on ranks other than 0: one run per job)."""
    names = parse_report_to(report_to)
    if not main_process or not names:
        return Trackers([])
    run_name = run_name or f"overdrive-{time.strftime('%Y%m%d-%H%M%S')}"
    opened = []
    try:
        for n in names:
            opened.append(_OPEN[n](out_dir, run_name, params or {}))
    except Exception as e:  # a tracker that cannot start: the ones already started are closed, then one line
        for t in opened:
            t.close(False)
        raise UserError(f"--report-to {n}: could not start a run ({type(e).__name__}: "
                        f"{(str(e).strip().splitlines() or [''])[0][:200]}): check its settings or drop it") from None
    return Trackers(opened)


def machine_params(env) -> dict:
    """The machine a run ran on, as tracker params: the fingerprint `tune` caches winners under, and
    what it hashes that a reader wants to see."""
    from overdrive.recipes.tuned import machine_fingerprint

    return {"fingerprint": machine_fingerprint(env), "device": env.device,
            "gpu": env.gpus[0].name if env.gpus else None, "gpus": len(env.gpus),
            "cpu": env.platform.get("cpu", {}).get("model"), "torch": env.torch.get("version")}


def accelerate_trackers(acc, env, report_to, *, logging_dir: str, run_name: str | None) -> Trackers:
    """accelerate(..., report_to=...): a run per tracker whose params are the recipe as asked and as it
    ran, the machine and the accumulation."""
    import logging

    r = acc.resolved
    params = {"recipe": r.recipe.to_dict(), "ran": {"precision": r.precision, "fp8_backend": r.fp8_backend,
                                                    "fp8_scaling": r.fp8_scaling, "compile": r.compile,
                                                    "optimizer": r.optimizer},
              "machine": machine_params(env), "grad_accum_steps": acc.grad_accum_steps}
    trk = open_trackers(report_to, out_dir=logging_dir, run_name=run_name, params=params,
                        main_process=acc.is_main_process)
    for line in trk.where:
        logging.getLogger("overdrive").info("accelerate: logging to %s", line)
    return trk


def train_params(cfg, resolved, world: int) -> dict:
    """`overdrive train`'s tracker params: the config, the recipe as it ran, the machine."""
    from overdrive.env import get_env

    return {"config": cfg.to_dict(), "recipe": resolved.recipe.to_dict(),
            "ran": {"precision": resolved.precision, "fp8_backend": resolved.fp8_backend, "compile": resolved.compile,
                    "optimizer": resolved.optimizer}, "world_size": world, "machine": machine_params(get_env())}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def report_results(res: dict, report_to, *, out: str, kind: str, env=None) -> list[str]:
    """`tune`/`bench` --report-to: one run per tracker; params the winner (or the suite) and the machine;
    each candidate's figures at step 0 and its per-step training losses at their steps (one series per
    candidate, steps rising, as W&B requires). Returns where each tracker wrote."""
    if env is None:
        from overdrive.env import get_env

        env = get_env()
    rows = res.get("candidates") or res.get("configs") or []
    params = {"kind": kind, "machine": machine_params(env)}
    if kind == "tune":
        params.update(winner=res.get("recipe"), workload=res.get("workload"), budget_s=res.get("budget_s"))
    else:
        params.update(suite=res.get("suite"), configs=[c.get("name") for c in rows])
    per_step: dict[int, dict[str, float]] = {}
    for c in rows:
        name = metric_key(str(c.get("name")))
        step_ms = c.get("step_ms")
        figs = {"step_ms": step_ms.get("median") if isinstance(step_ms, dict) else step_ms,
                "speedup": c.get("speedup"), "tflops": c.get("tflops"), "mfu": c.get("mfu"),
                "loss_delta_pct": c.get("loss_delta_pct")}
        for role, m in (c.get("models") or {}).items():
            for k in ("tokens_per_s", "examples_per_s", "tflops", "mfu_bf16_peak"):
                figs[f"{role}/{k}"] = (m or {}).get(k)
        per_step.setdefault(0, {}).update({f"{name}/{k}": v for k, v in figs.items() if _num(v) is not None})
        series = {"loss": c.get("losses") or []}  # tune: one loss per step; bench: per role, in raw
        series.update({k: v for k, v in (c.get("raw") or {}).items() if k.endswith("_loss") and isinstance(v, list)})
        for key, losses in series.items():
            for i, loss in enumerate(losses):
                if _num(loss) is not None:
                    per_step.setdefault(i, {})[f"{name}/{key}"] = loss
    trk = open_trackers(report_to, out_dir=out, run_name=f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}", params=params)
    try:
        for step in sorted(per_step):
            trk.log(per_step[step], step=step)
    finally:
        where = list(trk.where)
        trk.close(ok=sys.exc_info()[0] is None)
    return where
