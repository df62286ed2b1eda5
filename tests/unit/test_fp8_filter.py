"""tune's measured per-layer FP8 filter: what decides a shape."""

from overdrive.tuning.fp8_filter import LinearSite, measure_filter


def test_the_head_kept_by_policy_does_not_veto_a_winning_layer_of_its_shape():
    """A GPT whose MLP width equals its vocabulary (the GPU test's d=1024, vocab 4096) has fc and lm_head both
    1024x4096. The head is never timed (it stays in high precision) and the recipe's shape filter keeps it
    out; counting it as a loss marked the winning fc "same KxN lost elsewhere: stays bf16"."""
    sites = [LinearSite(fqn="blocks.0.fc", in_features=1024, out_features=4096, tokens=4096),
             LinearSite(fqn="lm_head", in_features=1024, out_features=4096, tokens=4096)]
    res = measure_filter(sites, bench=lambda m, k, n, fp8: 1.0 if fp8 else 2.0)
    by = {d["fqn"]: d for d in res.layers}
    assert by["blocks.0.fc"]["convert"] and res.shapes == "1024x4096", by["blocks.0.fc"]["reason"]
    assert not by["lm_head"]["convert"] and "head" in by["lm_head"]["reason"]


def test_a_timed_loss_still_vetoes_the_shape():
    sites = [LinearSite(fqn="a", in_features=64, out_features=64, tokens=4096),
             LinearSite(fqn="b", in_features=64, out_features=64, tokens=16)]
    res = measure_filter(sites, bench=lambda m, k, n, fp8: (1.0 if fp8 else 2.0) if m == 4096 else
                         (1.0 if fp8 else 0.5))
    assert res.shapes == "" and "lost elsewhere" in {d["fqn"]: d for d in res.layers}["a"]["reason"]
