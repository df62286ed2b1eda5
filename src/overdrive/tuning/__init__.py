"""`tune`: measure the recipes on the user's own model and pick the fastest safe one.

    result = overdrive.tune("models.py:make_model", "models.py:batch", budget_s=150)
    acc = overdrive.accelerate(make_model(), recipe=result.best)   # or recipe="tuned" later

`overdrive.tune` is the function `tune` below; this package is `overdrive.tuning`, so that importing
it (or `overdrive.tuning.api`) never rebinds the package's public name.
"""

from overdrive.tuning.api import TuneResult, tune
from overdrive.tuning.safety import Tolerance

__all__ = ["tune", "TuneResult", "Tolerance"]
