"""config.pbtxt written and read through Triton's own protobuf message, `inference.ModelConfig`.

The message is built field by field and printed by `google.protobuf.text_format`, so every string (a
model name, the provenance of the batcher settings, which may come from a results file a user hands
over) is a quoted, escaped protobuf string: no text reaches the file as a line of its own. Triton's
generated module (`tritonclient.grpc.model_config_pb2`, the `triton` extra) checks every field Triton
knows; without it, the subset of the same message in `triton_schema` (same names, numbers and enums)
does, and `config_schema()` says which one was used.

Shapes (Triton: server docs model_configuration.md, "Reshape"): with max_batch_size > 0 `dims` leaves
out the batch; a tensor with no other dimension (a per-request scalar, or a model returning (B,)) is
`dims: [ 1 ]` with `reshape: { shape: [ ] }`, so the model itself keeps its (B,) shape and clients see
(B, 1), which is what Triton returns for such an output.
"""

from __future__ import annotations

from overdrive.serve.batching import default_batching
from overdrive.serve.triton_schema import TritonRepoError, model_config_subset

__all__ = ["model_config_class", "config_schema", "build_config", "config_text", "triton_config", "parse_config",
           "VARIANT_KEY", "SOURCE_KEY", "PRODUCTION"]

VARIANT_KEY = "overdrive_variant"
"""The parameter that says which of the exported models this one is (production, or served here)."""
SOURCE_KEY = "overdrive_batching_source"
"""The parameter that says where the dynamic batcher settings came from (measured, or Triton's defaults)."""
PRODUCTION = ("production: the ONNX Runtime backend of Triton's container (onnxruntime_onnx); the same model.onnx "
              "is served here by overdrive serve from triton_local/")
"""What the production model's config says it is (`triton_local` writes the variant served here)."""


def _triton_pb2():
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError:  # the `triton` extra is not installed (or grpcio is missing): the subset checks
        return None
    return model_config_pb2


def model_config_class():
    """inference.ModelConfig: Triton's generated class when the `triton` extra is installed, else the subset."""
    pb2 = _triton_pb2()
    if pb2 is not None:
        return pb2.ModelConfig
    return model_config_subset()


def config_schema() -> str:
    """Which ModelConfig checked the config: Triton's own, or the subset (and how to get Triton's)."""
    return ("tritonclient.grpc.model_config_pb2 (Triton's own)" if _triton_pb2() is not None else
            "overdrive's subset of inference.ModelConfig (pip install 'tritonclient[grpc]', the overdrive[triton] extra, for Triton's own)")


def _io(msg, name: str, dims: list[int], data_type: str) -> None:
    msg.name = name
    msg.data_type = type(msg).DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_name[data_type].number
    if dims:
        msg.dims.extend(int(d) for d in dims)
    else:  # (B,): Triton wants a non-batch dim; the model keeps its own shape through reshape
        msg.dims.append(1)
        msg.reshape.SetInParent()  # present and empty: `reshape: { }` means shape [ ]


def build_config(name: str, spec: dict, batching: dict | int, *, platform: str | None = None,
                 backend: str | None = None, kind: str = "KIND_CPU", parameters: dict | None = None,
                 threads_parameters: bool = False):
    """The ModelConfig message of one model: I/O from `spec` ({"inputs"/"outputs": [(name, dims, type)]},
    dims without the batch, [] for a (B,) tensor), dynamic batching and instances from `batching`
    (a max batch size alone means Triton's defaults), string `parameters` (escaped by protobuf).
    threads_parameters: the ONNX Runtime backend's own pool sizes (onnxruntime_backend parameters
    intra_op_thread_count / inter_op_thread_count), set to what was measured: unset, it takes every core."""
    b = default_batching(batching) if isinstance(batching, int) else batching
    cfg = model_config_class()()
    cfg.name = name
    if platform:
        cfg.platform = platform
    if backend:
        cfg.backend = backend
    cfg.max_batch_size = int(b["max_batch_size"])
    for n, d, t in spec["inputs"]:
        _io(cfg.input.add(), n, d, t)
    for n, d, t in spec["outputs"]:
        _io(cfg.output.add(), n, d, t)
    db = cfg.dynamic_batching
    db.SetInParent()
    db.preferred_batch_size.extend(int(p) for p in b.get("preferred_batch_size") or [])
    db.max_queue_delay_microseconds = int(b.get("max_queue_delay_us", 0))
    g = cfg.instance_group.add()
    g.count = int(b.get("instances", 1))
    g.kind = type(g).Kind.Value(kind)
    params = dict(parameters or {})
    if b.get("source"):
        params[SOURCE_KEY] = str(b["source"])
    if threads_parameters and b.get("threads"):
        params.update(intra_op_thread_count=str(int(b["threads"])), inter_op_thread_count="1")
    for k, v in params.items():
        cfg.parameters[str(k)].string_value = str(v)
    return cfg


def config_text(cfg, *, header: tuple[str, ...] = ()) -> str:
    """protobuf text format of `cfg`, after `header` comment lines (our own fixed text, never user input)."""
    from google.protobuf import text_format

    for h in header:
        assert "\n" not in h and "\r" not in h, "a header line is one line of our own text"
    return "".join(f"# {h}\n" for h in header) + text_format.MessageToString(cfg)


def triton_config(name: str, platform: str, spec: dict, batching: dict | int, *, kind: str = "KIND_CPU") -> str:
    """config.pbtxt of the production model (`platform`, e.g. onnxruntime_onnx) as text."""
    cfg = build_config(name, spec, batching, platform=platform, kind=kind, parameters={VARIANT_KEY: PRODUCTION},
                       threads_parameters=platform == "onnxruntime_onnx")
    return config_text(cfg, header=(f"written by overdrive export: {PRODUCTION}",
                                    f"where the batcher settings come from: the parameter {SOURCE_KEY}"))


def parse_config(text: str, where: str = "config.pbtxt"):
    """config.pbtxt text -> an inference.ModelConfig message (protobuf text format, strict: an unknown
    field or a wrong type is refused, as the server refuses it)."""
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, model_config_class()())
    except text_format.ParseError as e:
        raise TritonRepoError(f"{where} is not a valid Triton model config: {e}") from None
