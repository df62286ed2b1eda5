"""DeepSpeed ZeRO-3 (`--sharding zero3`): its partitions, its gathered window checked against a replay of DeepSpeed's
own fetch / prefetch / release rules, its step's fp32 cast, its per-module communication, and what it refuses."""

import dataclasses

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.comm import comm_times
from overdrive.plan.memory import terms
from overdrive.plan.search import plan
from overdrive.plan.zero3 import (MAX_LIVE, PREFETCH_BUCKET, REDUCE_BUCKET, REUSE_DISTANCE, gathered_modules,
                                  zero3_buffers, zero3_startup_bytes, zero3_step_bytes)

H100 = gpu_by_key("h100-sxm")


def _s(**kw):
    return TrainSetup(**{**dict(gpu=H100, gpus_per_node=8, nodes=4, seq=4096, sharding="zero3"), **kw})


def _trace(m, ckpt: bool, tp: int) -> list[tuple[object, float]]:
    """(module, elements on this TP rank) in the order a step uses them: the embedding, each block's linears, the
    head; backward the reverse, a checkpointed block's forward run again just before its backward."""
    h, q, kv, F = m.hidden, m.q_dim, m.kv_dim, m.ffn
    linears = [h * q, h * kv, h * kv, q * h] + [h * F] * (3 if m.gated_mlp else 2)
    blk = [n / tp for n in linears]
    emb, head = ("emb", m.vocab * h / tp), ("head", m.vocab * h / tp)
    fwd = [emb] + [((i, j), n) for i in range(m.n_layer) for j, n in enumerate(blk)] + [head]
    bwd = [head]
    for i in reversed(range(m.n_layer)):
        bwd += [((i, j), n) for j, n in enumerate(blk)] if ckpt else []
        bwd += [((i, j), n) for j, n in reversed(list(enumerate(blk)))]
    return fwd + bwd + [emb]


def _replay(trace) -> float:
    """Most elements gathered at once under DeepSpeed's rules (partitioned_param_coordinator.py @ edaa7221): fetch
    the module in use; prefetch what comes next in the trace, at most PREFETCH_BUCKET a step and never past MAX_LIVE
    gathered; release a module after its use unless the modules within REUSE_DISTANCE elements after it use it
    again or it was prefetched for a later use."""
    live, gathered, ahead, peak = {}, 0.0, 0, 0.0
    for step, (mod, n) in enumerate(trace):
        if mod not in live:
            live[mod] = n
            gathered += n
        ahead = max(ahead, step + 1)
        budget, got = min(MAX_LIVE - gathered, PREFETCH_BUCKET), 0.0
        while ahead < len(trace) and got < budget:
            nxt, nn = trace[ahead]
            ahead += 1
            if nxt not in live:
                live[nxt] = nn
                gathered += nn
                got += nn
        peak = max(peak, gathered)
        keep, walked = any(trace[k][0] == mod for k in range(step + 1, ahead)), 0.0
        for later, ln in trace[step + 1:]:
            if keep or walked >= REUSE_DISTANCE:
                break
            keep, walked = later == mod, walked + ln
        if not keep:
            gathered -= live.pop(mod)
    return peak


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "llama3-405b"])
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("ckpt", [False, True])
def test_gathered_window_matches_a_replay_of_deepspeeds_rules(name, tp, ckpt):
    m = get_model(name)
    s = _s(tp=tp, checkpointing="full" if ckpt else "none")
    shard = m.n_params() / tp
    planned = zero3_buffers(m, s, shard) / 2 - min(REDUCE_BUCKET, shard)   # elements gathered, bf16
    replayed = _replay(_trace(m, ckpt, tp))
    # an upper bound (the head is counted on top of a full window), never more than 10% over the replay
    assert replayed * 0.99 <= planned <= replayed * 1.10, (planned / 1e6, replayed / 1e6)
    assert replayed > MAX_LIVE * 0.95 or replayed >= shard * 0.95   # the window fills: this is not a small term


def test_states_are_zeros_two_two_and_twelve_and_offload_moves_them():
    m = get_model("llama3-8b")
    s = _s()
    P, S = m.n_params(), s.shards
    t = terms(m, s)
    assert t["params"] == pytest.approx(6 * P / S)      # 16-bit partition + fp32 master
    assert t["grads"] == pytest.approx(2 * P / S)       # gradient partitions in the model dtype
    assert t["optimizer"] == pytest.approx(8 * P / S)   # AdamW's two fp32 states
    fsdp = terms(m, dataclasses.replace(s, sharding="fsdp"))
    # the same 16 bytes a parameter as FSDP2's fp32 shard + fp32 grads + states, split differently
    assert t["params"] + t["grads"] + t["optimizer"] == pytest.approx(
        fsdp["params"] + fsdp["grads"] + fsdp["optimizer"])
    opt = terms(m, dataclasses.replace(s, offload="optimizer"))
    assert (opt["params"], opt["grads"], opt["optimizer"]) == pytest.approx((2 * P / S, 0, 0))
    par = terms(m, dataclasses.replace(s, offload="params"))
    assert (par["params"], par["grads"], par["optimizer"]) == (0, 0, 0)
    assert par["buffers"] == opt["buffers"] > 0   # the gathered window and the reduce bucket stay on the GPU


def test_window_does_not_shrink_with_more_gpus_where_fsdps_block_buffers_do_not_either():
    m = get_model("llama3-405b")
    small, big = _s(nodes=2, tp=8), _s(nodes=64, tp=8)
    assert terms(m, small)["buffers"] == terms(m, big)["buffers"]
    # a 405B block is 3.2B elements: FSDP holds two gathered plus one in fp32 grads, DeepSpeed its live window
    fsdp = terms(m, dataclasses.replace(small, sharding="fsdp", tp=1))
    z3 = terms(m, dataclasses.replace(small, tp=1))
    assert z3["buffers"] < fsdp["buffers"] / 3


def test_step_casts_one_sub_group_to_fp32_after_the_backward():
    m = get_model("llama3-8b")
    one = _s(nodes=1, gpus_per_node=1, micro_batch=1, seq=512)
    P = m.n_params()
    assert zero3_step_bytes(P, 1, one) == 6 * 1e9                 # capped at one sub-group
    assert zero3_step_bytes(P, 32, _s()) == pytest.approx(6 * P / 32)
    assert zero3_step_bytes(P, 32, _s(offload="optimizer")) == 0   # the step runs on the CPU
    short = _s(nodes=1, seq=512)   # activations and logits below the step's cast: the step is the peak
    t = terms(m, short)
    step = zero3_step_bytes(P, 8, short)
    assert step == 6e9   # 1.004e9 elements on each of 8 shards: one sub-group of 1e9
    assert t["activations"] + t["logits"] < t["grads"] + step
    assert t["allocated"] == pytest.approx(t["params"] + t["optimizer"] + t["buffers"] + t["grads"] + step)


def test_comm_is_per_module_in_the_model_dtype_every_micro_batch():
    m = get_model("llama3-70b")
    s = _s(global_batch=64, micro_batch=1)   # 32 ranks: 2 micro-batches each
    c = comm_times(m, s, 0.0)
    mods = m.n_layer * gathered_modules(m) + 2
    buckets = -(-m.n_params() // REDUCE_BUCKET)
    assert c["dp_calls"] == s.grad_accum * (2 * mods + buckets)
    f = comm_times(m, dataclasses.replace(s, sharding="fsdp"), 0.0)
    assert c["dp_calls"] > 4 * f["dp_calls"]              # module by module vs block by block
    assert c["dp"] < f["dp"]                              # bf16 reduce-scatter vs FSDP2's fp32 one
    e = estimate(m, s)
    assert e.comm["dp_algo"] == "ring" and e.tokens_per_s_per_gpu > 0


@pytest.mark.parametrize("kw, needle", [
    (dict(pp=2, nodes=4), "--pp > 1"),
    (dict(fp8_all_gather=True, precision="fp8"), "--fp8-all-gather"),
    (dict(gather_dtype="fp32"), "--gather-dtype fp32"),
    (dict(stack="megatron"), "--stack megatron"),
])
def test_refuses_what_deepspeed_zero3_does_not_run(kw, needle):
    with pytest.raises(ValueError, match="--sharding zero3") as e:
        _s(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_every_checkpointed_input_may_go_to_the_host():
    m = get_model("llama3-8b")
    full = _s(checkpointing="full", offload_activations=m.n_layer)
    some = dataclasses.replace(full, offload_activations=m.n_layer // 2)
    none = dataclasses.replace(full, offload_activations=0)
    a = [terms(m, x)["activations"] for x in (full, some, none)]
    assert a[0] < a[1] < a[2]
    with pytest.raises(ValueError, match="fewer"):
        estimate(m, _s(offload_activations=m.n_layer))


@pytest.mark.parametrize("precision, width", [("bf16", 2), ("fp32", 4)])
def test_a_model_built_whole_is_on_every_gpu_once_at_start_up(precision, width):
    """--no-zero-init: deepspeed.initialize casts the model to its dtype and moves all of it to each GPU before it
    partitions it (engine.py _configure_distributed_model), so the peak is at least the whole model; under
    zero.Init it is never whole. Short sequences peak at start-up, long ones in the step, never below either."""
    m = get_model("llama3-8b")
    built = _s(nodes=1, offload="optimizer", checkpointing="full", micro_batch=1, global_batch=8, precision=precision)
    whole = dataclasses.replace(built, zero_init=False)
    assert zero3_startup_bytes(m, built) == 0
    assert zero3_startup_bytes(m, whole) == width * m.n_params()
    short, long = terms(m, whole), terms(m, dataclasses.replace(whole, seq=131072))
    assert short["allocated"] == pytest.approx(width * m.n_params())
    assert short["allocated"] > terms(m, built)["allocated"]
    assert short["startup"] == pytest.approx(short["allocated"] - terms(m, built)["allocated"])
    step = terms(m, dataclasses.replace(built, seq=131072))
    assert long["startup"] == 0 and long["allocated"] == step["allocated"] > long["startup_bytes"]
    # the breakdown still adds up to what the GPU needs, the excess under "other"
    e = estimate(m, whole)
    assert sum(e.breakdown_gib.values()) == pytest.approx(e.memory_gib)
    assert any("--no-zero-init" in n and "zero.Init" in n for n in e.notes)


def test_a_start_up_too_big_for_the_gpu_is_refused_with_zero_init_as_the_fix():
    m = get_model("llama3-70b")   # 141 GB whole in bf16: no 80 GB GPU holds it, however many share the step
    r = plan(m, H100, gpus_per_node=8, nodes=1, seq=4096, global_batch=8, micro_batch=1, offload="optimizer",
             checkpointing=("full",), precisions=("bf16",), zero_init=False)
    assert r["top"] is None and r["why"] == "nothing fits"
    first = r["suggestions"][1]
    assert first.startswith("the model built under deepspeed.zero.Init") and "GiB per GPU" in first
    assert "not enough alone" not in first


def test_refuses_no_zero_init_without_zero3():
    with pytest.raises(ValueError, match="--no-zero-init plans DeepSpeed ZeRO-3") as e:
        _s(sharding="fsdp", zero_init=False)
    assert "--sharding zero3" in str(e.value) and "\n" not in str(e.value)


def test_zero_init_is_suggested_only_where_start_up_is_the_peak():
    """Llama 3 70B at 8K on 8 H100s without offload: the step (about 150 GiB) is above the whole model (131 GiB), so
    zero.Init would save nothing there and is not offered; more GPUs are, with zero.Init beside them."""
    m = get_model("llama3-70b")
    r = plan(m, H100, gpus_per_node=8, nodes=1, seq=8192, global_batch=8, micro_batch=1, checkpointing=("full",),
             precisions=("bf16",), zero_init=False)
    assert r["top"] is None
    assert not any(x.startswith("the model built under deepspeed.zero.Init") for x in r["suggestions"])
    assert "deepspeed.zero.Init" in r["suggestions"][-1] and "more GPUs" in r["suggestions"][-1]


def test_start_up_is_a_json_figure_and_the_pipeline_refusal_names_the_flag():
    from overdrive.plan.search import cand_dict

    m = get_model("llama3-8b")
    e = estimate(m, _s(nodes=1, global_batch=8, micro_batch=1, offload="optimizer", zero_init=False))
    assert cand_dict(e)["startup_gib"] == pytest.approx(2 * m.n_params() / 2**30, rel=1e-3)
    assert "startup_gib" not in cand_dict(estimate(m, _s(nodes=1, global_batch=8, micro_batch=1)))
    with pytest.raises(ValueError, match="without --no-zero-init"):
        _s(pp=2, zero_init=False)
