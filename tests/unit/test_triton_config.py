"""config.pbtxt through Triton's protobuf: tampered results cannot add lines, names are escaped, a (B,)
output keeps its shape through reshape, and every field round-trips through the strict parser."""

import json

import pytest

from overdrive.serve.export import batching_from
from overdrive.serve.triton_config import SOURCE_KEY, VARIANT_KEY, build_config, config_text, parse_config, triton_config

SPEC = {"inputs": [("dense", [13], "TYPE_FP32"), ("ids", [26, -1], "TYPE_INT64")],
        "outputs": [("prob", [1], "TYPE_FP32")]}
INJECT = 'CPU\ninstance_group [ { count: 64 kind: KIND_GPU } ]\n#'


def _results(tmp_path, *, device="cpu", label="ONNX Runtime (CPU EP)", created="2026-12-01"):
    res = {"slo_ms": 5.0, "device": device, "created": created, "workloads": {},
           "serving": {"threads": 1, "engines": {"onnxruntime": {"label": label, "status": "ok", "best": {
               "rate": 1000.0, "config": {"max_batch_size": 32, "preferred_batch_size": [16, 32],
                                          "max_queue_delay_us": 250, "instances": 1, "kind": "KIND_CPU"}}}}}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    return str(tmp_path)


@pytest.mark.parametrize("field", ["device", "label", "created"])
def test_tampered_results_cannot_inject_lines(tmp_path, field):
    b = batching_from(_results(tmp_path, **{field: INJECT}), "recsys")
    text = triton_config("click_model", "onnxruntime_onnx", SPEC, b)
    cfg = parse_config(text)
    # One instance group, the measured one: the tampered text stayed inside one escaped string.
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, type(cfg.instance_group[0]).Kind.Value("KIND_CPU"))]
    assert INJECT in cfg.parameters[SOURCE_KEY].string_value  # verbatim, round-tripped
    assert not any(line.lstrip().startswith("instance_group [") for line in text.splitlines())
    assert sum(line.startswith("#") for line in text.splitlines()) == 2  # our own header, nothing else


def test_names_and_parameters_are_escaped():
    spec = {"inputs": [('x"\n}', [3], "TYPE_FP32")], "outputs": [("y", [2], "TYPE_FP32")]}
    cfg = build_config('m"\nplatform: "evil', spec, 4, platform="onnxruntime_onnx",
                       parameters={VARIANT_KEY: 'a\n}\nmax_batch_size: 9'})
    back = parse_config(config_text(cfg))
    assert back.name == 'm"\nplatform: "evil' and back.platform == "onnxruntime_onnx" and back.max_batch_size == 4
    assert back.input[0].name == 'x"\n}' and back.parameters[VARIANT_KEY].string_value == 'a\n}\nmax_batch_size: 9'


def test_a_batch_only_output_keeps_its_shape_through_reshape():
    spec = {"inputs": [("x", [4], "TYPE_FP32")], "outputs": [("score", [], "TYPE_FP32")]}
    cfg = parse_config(triton_config("m", "onnxruntime_onnx", spec, 8))
    out = cfg.output[0]
    # Triton needs a non-batch dim: clients see (B, 1); the model itself produces (B,).
    assert list(out.dims) == [1] and out.HasField("reshape") and list(out.reshape.shape) == []
    assert not cfg.input[0].HasField("reshape") and list(cfg.input[0].dims) == [4]


def test_fields_round_trip_and_unknown_fields_are_refused():
    from overdrive.serve.triton_repo import TritonRepoError

    b = {"max_batch_size": 64, "preferred_batch_size": [32, 64], "max_queue_delay_us": 500, "instances": 2,
         "threads": 1, "source": "measured"}
    cfg = parse_config(triton_config("m", "onnxruntime_onnx", SPEC, b, kind="KIND_GPU"))
    assert (cfg.max_batch_size, list(cfg.dynamic_batching.preferred_batch_size),
            cfg.dynamic_batching.max_queue_delay_microseconds, cfg.instance_group[0].count) == (64, [32, 64], 500, 2)
    assert cfg.parameters["intra_op_thread_count"].string_value == "1"
    assert [list(i.dims) for i in cfg.input] == [[13], [26, -1]]
    with pytest.raises(TritonRepoError, match="not a valid Triton model config"):
        parse_config('name: "m"\nmax_batch_sizes: 3\n')


def test_triton_own_model_config_is_used_when_installed():
    pytest.importorskip("tritonclient.grpc", reason="the `triton` extra (tritonclient[grpc]) is not installed")
    from tritonclient.grpc import model_config_pb2

    from overdrive.serve.triton_config import config_schema

    assert isinstance(parse_config('name: "m"'), model_config_pb2.ModelConfig) and "Triton's own" in config_schema()
    # A field the subset lacks but Triton knows parses: the whole message checks the file.
    assert parse_config('name: "m"\nmodel_warmup [ { name: "w" batch_size: 1 } ]').model_warmup[0].batch_size == 1


def test_a_user_model_returning_batch_only_is_not_reshaped_silently(tmp_path):
    import torch

    from overdrive.serve.export import user_served_model

    (tmp_path / "m.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n    return nn.Sequential(nn.Linear(4, 1), nn.Flatten(0))\n"
        "def x(b):\n    return torch.randn(b, 4)\n")
    served = user_served_model(f"{tmp_path}/m.py:make", f"{tmp_path}/m.py:x")
    with torch.no_grad():
        assert served.module(torch.randn(3, 4)).shape == (3,)  # the module exported is the user's, (B,) out
    assert served.spec["outputs"] == [("output", [], "TYPE_FP32")]
    out = parse_config(triton_config("make", "onnxruntime_onnx", served.spec, 8)).output[0]
    assert list(out.dims) == [1] and list(out.reshape.shape) == [] and out.HasField("reshape")


def test_slo_from_prefers_the_real_server_result(tmp_path):
    path = _results(tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    res["triton"] = {"status": "ok", "measured_rate": 850.0, "simulated_rate": 1000.0, "setting": {
        "max_batch_size": 32, "preferred_batch_size": [16, 32], "max_queue_delay_us": 250, "instances": 1,
        "kind": "KIND_CPU"}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    b = batching_from(path, "recsys")
    assert b["source"].startswith("measured on a real tritonserver") and "850 req/s" in b["source"]
    assert b["max_batch_size"] == 32 and b["threads"] == 1
    res["triton"]["measured_rate"] = "9\ninstance_group [ ]"  # tampered: refused, nothing written
    (tmp_path / "results.json").write_text(json.dumps(res))
    from overdrive.serve.export import ExportError

    with pytest.raises(ExportError, match="not one a bench writes"):
        batching_from(path, "recsys")
