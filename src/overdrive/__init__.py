"""Overdrive: fast, verified PyTorch Transformer training, with honest fallbacks.

    import overdrive
    acc = overdrive.accelerate(model, recipe="auto", lr=3e-4)

The public names load on first use (PEP 562), so `import overdrive` and the CLI's `--help`
stay free of torch (a 2-30 s import on a busy host).
"""

__version__ = "0.1.0"

from overdrive.quiet import install_from_env as _install_from_env  # noqa: E402

_install_from_env()  # a bench worker or torchrun rank started by the CLI: filter the same known noise

__all__ = ["__version__", "accelerate", "Accelerated", "get_env", "Recipe", "PRESETS", "get_recipe", "resolve",
           "ResolvedRecipe", "RecipeUnavailable", "tune", "TuneResult", "AccelerateOptions"]

_LAZY = {"accelerate": "overdrive.accelerated", "Accelerated": "overdrive.accelerated",
         "AccelerateOptions": "overdrive.accelerated", "get_env": "overdrive.env", "Recipe": "overdrive.recipes",
         "PRESETS": "overdrive.recipes", "get_recipe": "overdrive.recipes", "resolve": "overdrive.recipes",
         "ResolvedRecipe": "overdrive.recipes", "RecipeUnavailable": "overdrive.recipes", "tune": "overdrive.tuning",
         "TuneResult": "overdrive.tuning"}
# Plain functions: `overdrive.accelerate` and `overdrive.tune` live in modules of other names
# (overdrive.accelerated, overdrive.tuning), so importing those never rebinds the public names.


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'overdrive' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

