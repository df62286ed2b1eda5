"""What an emitter writes from: the winning recipe as it ran, read from a tune folder or a recipe.json.

A tune folder (results.json + recipe.json) gives the winner as it ran on the measuring machine (its
resolved fields: the FP8 engine, the AdamW implementation, the norms) and, for FP8, the measured
per-layer filter with the layers' names. A recipe.json alone is resolved on this machine (`env`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from overdrive.errors import UserError
from overdrive.io import load_json_bounded
from overdrive.recipes import Recipe, resolve

__all__ = ["Target", "load_target"]


@dataclass(frozen=True, kw_only=True)
class Target:
    recipe: Recipe
    ran: dict
    """The resolved fields: precision, fp8_backend, fp8_scaling, optimizer, norm, loss, compile,
    activation_checkpointing, checkpoint_every, emulated."""
    where: str
    """Where `ran` comes from: "measured by overdrive tune on <device>" or "resolved on this machine"."""
    fp8_layers: list[dict] = field(default_factory=list)
    """The measured per-layer FP8 filter (tune's rows): fqn, shape, convert, reason."""
    source: str = ""

    @property
    def fp8(self) -> bool:
        return self.ran.get("precision") in ("fp8", "fp4") and bool(self.ran.get("fp8_backend"))

    @property
    def fp8_skip_fqns(self) -> list[str]:
        return [d["fqn"] for d in self.fp8_layers if not d.get("convert")]

    @property
    def fp8_convert_fqns(self) -> list[str]:
        return [d["fqn"] for d in self.fp8_layers if d.get("convert")]


def _read_json(path: str, what: str) -> dict:
    try:
        d = load_json_bounded(path, what="a tune result or recipe")
    except FileNotFoundError:
        raise UserError(f"{path} not found: pass a tune folder (overdrive tune --out DIR) or its recipe.json") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{what} {path} is not readable JSON ({e}): re-run `overdrive tune --out DIR`") from None
    if not isinstance(d, dict):
        raise UserError(f"{what} {path} holds no JSON object: re-run `overdrive tune --out DIR`")
    return d


_RAN_FIELDS = ("precision", "fp8_backend", "fp8_scaling", "optimizer", "norm", "loss", "compile",
               "activation_checkpointing", "checkpoint_every", "emulated", "device")
"""The resolved fields an emitter copies into a config or a comment (the rest, e.g. decisions, is not read)."""


def _check_text(src: str, fields: dict) -> None:
    # A tune folder is untrusted: every field copied into a config is a scalar, and text is one printable line.
    for k, v in fields.items():
        ok = v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and v.isprintable())
        if not ok:
            raise UserError(f"{src}: field {k}={v!r:.80} is not one printable value: the file was altered; re-run "
                            "`overdrive tune --out DIR`")


def load_target(src: str, *, env=None) -> Target:
    """A tune folder, a tune results.json, or a recipe.json -> the Target to emit."""
    if os.path.isdir(src):
        res_path = os.path.join(src, "results.json")
        if not os.path.exists(res_path):
            return load_target(os.path.join(src, "recipe.json"), env=env)
        src = res_path
    d = _read_json(src, "file")
    if d.get("schema") == "overdrive.tune/1":
        row = next((r for r in d.get("candidates", []) if isinstance(r, dict) and r.get("name") == d.get("best")), None)
        if row is None or not isinstance(row.get("resolved"), dict) or not isinstance(row.get("recipe"), dict):
            raise UserError(f"{src}: the winner {d.get('best')!r} has no recorded recipe: re-run `overdrive tune --out "
                            "DIR`")
        try:
            recipe = Recipe(**row["recipe"])
        except (TypeError, ValueError) as e:
            raise UserError(f"{src}: the winner's recipe is not one this Overdrive reads ({e}): re-run tune") from None
        layers = [x for x in ((row.get("fp8_filter") or {}).get("layers") or []) if isinstance(x, dict) and "fqn" in x]
        dev = d.get("gpu") or d.get("cpu") or d.get("device") or "the measuring machine"
        _check_text(src, {**{k: v for k, v in row["resolved"].items() if k in _RAN_FIELDS}, "gpu/cpu/device": dev, **{f"fp8_filter fqn {i}": x["fqn"]
                                                                       for i, x in enumerate(layers)}})
        return Target(recipe=recipe, ran=dict(row["resolved"]), where=f"measured by overdrive tune on {dev}",
                      fp8_layers=layers if recipe.fp8_shapes else [], source=src)
    recipe = Recipe.load(src)
    if env is None:
        from overdrive.env import get_env

        env = get_env()
    r = resolve(recipe, env)
    return Target(recipe=recipe, ran=r.to_dict(), where=f"resolved on this machine ({env.device})", source=src)
