"""The measurement core that bench and tune both use: the one worker protocol (`worker`: a policy's
`Program` of tasks served over a Pipe) and launcher (`launch`: spawn or forkserver-with-preload,
bound to the parent, a timeout on every answer), the one `Candidate` (`candidate`), the one round
driver bench and tune configure (`session`: looks, early stop, A/A twin, seeds, verdicts), rounds
(clock, interleaved rotating schedule), statistics (paired per-round ratios, bootstrap over rounds, the A/A
noise floor and the verdict that must clear it), thread planning, worker lifetime, the quality judge,
percentile sufficiency, and results folders that are locked and ours. Bench and tune are policies
over it: what to measure, in what order, and what to conclude.

Importing this package is light (numpy only); torch is imported by the workers.
"""

from overdrive.measure.percentiles import aa_floor, latency_summary, min_samples, percentile
from overdrive.measure.session import RoundsConfig, RoundSession
from overdrive.measure.stats import (BUSY_FLOOR, MIN_EVIDENCE_ROUNDS, Comparison, NoiseFloor, compare,
                                     evidence_of_slowdown, host_too_busy, noise_floor, paired_ci, round_medians,
                                     round_ratios, summarize)
from overdrive.measure.threads import ThreadPlan, host_load, load_report, plan_threads

__all__ = ["paired_ci", "round_medians", "round_ratios", "noise_floor", "NoiseFloor", "compare", "Comparison",
           "host_too_busy", "evidence_of_slowdown", "MIN_EVIDENCE_ROUNDS", "BUSY_FLOOR", "summarize",
           "min_samples", "percentile", "latency_summary", "aa_floor", "plan_threads", "ThreadPlan", "host_load",
           "load_report", "RoundSession", "RoundsConfig"]
