"""The Triton repository as the server reads it: layout, names, config (protobuf text format), the
model's I/O against the config, external data beside the model, and a run in onnxruntime. A small
ONNX model is built with onnx.helper (no exporter: fast); the exporter's own output is checked in
the slow export tests."""

import importlib.util
import json
import os

import pytest

pytestmark = pytest.mark.skipif(not (importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxruntime")),
                                reason="onnx/onnxruntime not installed (the `export` extra)")

from overdrive.serve.triton_local import PRODUCTION  # noqa: E402

SPEC = {"inputs": [("dense", [13], "TYPE_FP32"), ("ids", [26, -1], "TYPE_INT64")],
        "outputs": [("prob", [1], "TYPE_FP32")]}
MEASURED = {"max_batch_size": 64, "preferred_batch_size": [32, 64], "max_queue_delay_us": 500, "instances": 1,
            "source": "measured: test"}


def _tiny_onnx(path: str, external: bool = True) -> None:
    """prob (B, 1) = sum(dense * w, axis 1) + 0 * sum(ids): the click model's I/O, bag length symbolic."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.linspace(0, 1, 13, dtype=np.float32), "w")
    nodes = [helper.make_node("Mul", ["dense", "w"], ["dw"]),
             helper.make_node("ReduceSum", ["dw", "ax1"], ["s"], keepdims=1),
             helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["idsf", "ax12"], ["z0"], keepdims=0),
             helper.make_node("Mul", ["z0", "zero"], ["z"]),
             helper.make_node("Unsqueeze", ["z", "ax1"], ["zz"]),
             helper.make_node("Add", ["s", "zz"], ["prob"])]
    consts = [numpy_helper.from_array(np.array([1], dtype=np.int64), "ax1"),
              numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "ax12"),
              numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")]
    g = helper.make_graph(nodes, "click", [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", 13]),
                                           helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 26, "bag"])],
                          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1])], [w, *consts])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    if external:
        onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data",
                  size_threshold=64)  # w (52 bytes of data) outside, the small axes inline
    else:
        onnx.save(m, path)


def _repo(tmp_path, name="click_model", cfg_name=None, batching=MEASURED, spec=SPEC):
    from overdrive.serve.export import triton_config

    v = tmp_path / "triton" / name / "1"
    v.mkdir(parents=True)
    _tiny_onnx(str(v / "model.onnx"))
    (v.parent / "config.pbtxt").write_text(triton_config(cfg_name or name, "onnxruntime_onnx", spec, batching))
    return tmp_path / "triton"


def test_repository_loads_as_triton_reads_it(tmp_path):
    from overdrive.serve.triton_repo import check_repository, parse_config

    root = _repo(tmp_path)
    [m] = check_repository(str(root))
    assert m == {"name": "click_model", "platform": "onnxruntime_onnx", "versions": [1], "max_batch_size": 64,
                 "preferred_batch_size": [32, 64], "max_queue_delay_microseconds": 500, "instances": 1, "ran": True,
                 "parameters": {"overdrive_batching_source": "measured: test", "overdrive_variant": PRODUCTION}}
    cfg = parse_config((root / "click_model" / "config.pbtxt").read_text())
    assert [list(i.dims) for i in cfg.input] == [[13], [26, -1]]  # the bag length is a dynamic dimension
    assert cfg.instance_group[0].kind == 2  # KIND_CPU
    assert (root / "click_model" / "1" / "model.onnx.data").is_file()


def test_name_that_is_not_the_folders_is_refused(tmp_path):
    from overdrive.serve.triton_repo import TritonRepoError, check_repository

    root = _repo(tmp_path, cfg_name="model.onnx.data")  # what the loop variable used to write
    with pytest.raises(TritonRepoError, match="is not the folder's"):
        check_repository(str(root))


def test_missing_external_data_and_bad_configs_are_refused(tmp_path):
    from overdrive.serve.triton_repo import TritonRepoError, check_repository, parse_config

    root = _repo(tmp_path)
    os.remove(root / "click_model" / "1" / "model.onnx.data")
    with pytest.raises(TritonRepoError, match="external data"):
        check_repository(str(root))
    with pytest.raises(TritonRepoError, match="not a valid Triton model config"):
        parse_config('name: "m"\nmax_batch_size: 8\nqueue_size: 3\n')  # no such field in ModelConfig
    with pytest.raises(TritonRepoError, match="not a valid Triton model config"):
        parse_config('name: "m"\ninput [ { name: "x" data_type: TYPE_FLOAT32 dims: [ 1 ] } ]\n')


def test_config_dims_must_match_the_model(tmp_path):
    from overdrive.serve.triton_repo import TritonRepoError, check_repository

    fixed_bag = {"inputs": [("dense", [13], "TYPE_FP32"), ("ids", [26, 5], "TYPE_INT64")],
                 "outputs": [("prob", [1], "TYPE_FP32")]}
    ok = check_repository(str(_repo(tmp_path / "a", spec=fixed_bag)))  # 5 fits a symbolic bag
    assert ok[0]["ran"]
    wrong = {"inputs": [("dense", [12], "TYPE_FP32"), ("ids", [26, -1], "TYPE_INT64")],
             "outputs": [("prob", [1], "TYPE_FP32")]}
    with pytest.raises(TritonRepoError, match="dense"):
        check_repository(str(_repo(tmp_path / "b", spec=wrong)))
    with pytest.raises(TritonRepoError, match="preferred_batch_size"):
        check_repository(str(_repo(tmp_path / "c", batching={**MEASURED, "preferred_batch_size": [128]})))


def test_a_per_request_scalar_input_is_dims_1_reshaped_and_empty_dims_are_refused(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from overdrive.serve.export import triton_config
    from overdrive.serve.triton_repo import TritonRepoError, check_repository

    # The model takes item_id of shape (batch,): Triton needs dims [ 1 ] and reshape { shape: [ ] }.
    g = helper.make_graph([helper.make_node("Cast", ["item_id"], ["f"], to=TensorProto.FLOAT),
                           helper.make_node("Unsqueeze", ["f", "ax"], ["score"])], "scalar",
                          [helper.make_tensor_value_info("item_id", TensorProto.INT64, ["batch"])],
                          [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
                          [onnx.numpy_helper.from_array(np.array([1], dtype=np.int64), "ax")])
    spec = {"inputs": [("item_id", [], "TYPE_INT64")], "outputs": [("score", [1], "TYPE_FP32")]}
    v = tmp_path / "triton" / "scalar" / "1"
    v.mkdir(parents=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(v / "model.onnx"))
    text = triton_config("scalar", "onnxruntime_onnx", spec, 8)
    from overdrive.serve.triton_config import parse_config

    i = parse_config(text).input[0]
    assert list(i.dims) == [1] and i.HasField("reshape") and list(i.reshape.shape) == []
    (v.parent / "config.pbtxt").write_text(text)
    assert check_repository(str(tmp_path / "triton"))[0]["ran"]  # run at batch 1 and 8 with the reshaped shape
    (v.parent / "config.pbtxt").write_text(text.replace("  dims: 1\n  reshape {\n  }\n", "", 1))
    with pytest.raises(TritonRepoError, match="has no dims, which Triton refuses"):
        check_repository(str(tmp_path / "triton"))


def test_config_carries_the_measured_batcher_settings(tmp_path):
    from overdrive.serve.export import batching_from, triton_config
    from overdrive.serve.triton_repo import parse_config

    res = {"slo_ms": 5.0, "device": "cpu", "created": "now", "workloads": {"recsys": {"best": {"batch": 256}}},
           "serving": {"threads": 1, "engines": {"onnxruntime": {"label": "ONNX Runtime (CPU EP)", "best": {
               "rate": 12345.0, "config": {"max_batch_size": 32, "preferred_batch_size": [16, 32],
                                           "max_queue_delay_us": 250, "instances": 1, "kind": "KIND_CPU"}}}}}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    b = batching_from(str(tmp_path), "recsys")
    cfg = parse_config(triton_config("click_model", "onnxruntime_onnx", SPEC, b))
    assert cfg.max_batch_size == 32 and list(cfg.dynamic_batching.preferred_batch_size) == [16, 32]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 250 and cfg.name == "click_model"
    # ONNX Runtime's thread pools as measured (1 intra-op thread), not the backend's default of every core.
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert (params["intra_op_thread_count"], params["inter_op_thread_count"]) == ("1", "1")
    assert params["overdrive_batching_source"].startswith("measured: ONNX Runtime (CPU EP) on cpu, highest rate 12,345")
    res["serving"]["engines"]["onnxruntime"]["best"] = None
    (tmp_path / "results.json").write_text(json.dumps(res))
    from overdrive.serve.export import ExportError

    with pytest.raises(ExportError, match="no setting of onnxruntime met"):
        batching_from(str(tmp_path), "recsys")
    # Triton's defaults when nothing was measured: no invented preferred sizes or delay.
    d = parse_config(triton_config("m", "onnxruntime_onnx", SPEC, 8))
    assert list(d.dynamic_batching.preferred_batch_size) == [] and d.dynamic_batching.max_queue_delay_microseconds == 0
