"""`tune`: measure the recipes on the user's own model and pick the fastest safe one.

    result = overdrive.tune("models.py:make_model", "models.py:batch", budget_s=150)
    acc = overdrive.accelerate(make_model(), recipe=result.best)   # or recipe="tuned" later
"""

import sys

from overdrive.tune.api import TuneResult, tune
from overdrive.tune.safety import Tolerance

__all__ = ["tune", "TuneResult", "Tolerance"]


class _CallableModule(type(sys.modules[__name__])):
    """`overdrive.tune(...)` calls `tune(...)`; the package stays an ordinary module otherwise."""

    def __call__(self, *args, **kwargs) -> TuneResult:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
