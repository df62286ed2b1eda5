"""The subset of Triton's `inference.ModelConfig` message that Overdrive writes (common/protobuf/
model_config.proto: same field names, numbers and enums), built from a descriptor: no generated code,
no grpc. `triton_config` uses it where Triton's own generated module is not installed."""

from __future__ import annotations

__all__ = ["TritonRepoError", "DATA_TYPES", "model_config_subset"]


class TritonRepoError(ValueError):
    """A repository Triton would refuse; the message says which file and why."""


DATA_TYPES = ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8",
              "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING",
              "TYPE_BF16"]  # values 0..14, as in model_config.proto
_CLASS = None


def _message(fd, name: str, fields: list[tuple], enums: tuple = ()):
    """Add message `name` to the file descriptor: fields as (name, number, type, label, type name or None)."""
    m = fd.message_type.add(name=name)
    for ename, values in enums:
        e = m.enum_type.add(name=ename)
        for n, v in values:
            e.value.add(name=n, number=v)
    for fname, num, typ, label, tname in fields:
        f = m.field.add(name=fname, number=num, type=typ, label=label)
        if tname:
            f.type_name = tname
    return m


def _tensor_messages(fd, F) -> None:
    O, R = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    _message(fd, "ModelTensorReshape", [("shape", 1, F.TYPE_INT64, R, None)])
    _message(fd, "ModelInput", [("name", 1, F.TYPE_STRING, O, None),
                                ("data_type", 2, F.TYPE_ENUM, O, ".inference.DataType"),
                                ("dims", 4, F.TYPE_INT64, R, None),
                                ("reshape", 5, F.TYPE_MESSAGE, O, ".inference.ModelTensorReshape"),
                                ("allow_ragged_batch", 7, F.TYPE_BOOL, O, None), ("optional", 8, F.TYPE_BOOL, O, None)])
    _message(fd, "ModelOutput", [("name", 1, F.TYPE_STRING, O, None),
                                 ("data_type", 2, F.TYPE_ENUM, O, ".inference.DataType"),
                                 ("dims", 3, F.TYPE_INT64, R, None),
                                 ("reshape", 5, F.TYPE_MESSAGE, O, ".inference.ModelTensorReshape")])


def _scheduling_messages(fd, F) -> None:
    O, R = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    _message(fd, "ModelInstanceGroup", [("name", 1, F.TYPE_STRING, O, None), ("count", 2, F.TYPE_INT32, O, None),
                                        ("gpus", 3, F.TYPE_INT32, R, None),
                                        ("kind", 4, F.TYPE_ENUM, O, ".inference.ModelInstanceGroup.Kind")],
             enums=[("Kind", [("KIND_AUTO", 0), ("KIND_GPU", 1), ("KIND_CPU", 2), ("KIND_MODEL", 3)])])
    _message(fd, "ModelDynamicBatching", [("preferred_batch_size", 1, F.TYPE_INT32, R, None),
                                          ("max_queue_delay_microseconds", 2, F.TYPE_UINT64, O, None),
                                          ("preserve_ordering", 3, F.TYPE_BOOL, O, None)])
    _message(fd, "ModelParameter", [("string_value", 1, F.TYPE_STRING, O, None)])


def _config_message(fd, F) -> None:
    O, R = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    cfg = _message(fd, "ModelConfig", [("name", 1, F.TYPE_STRING, O, None), ("platform", 2, F.TYPE_STRING, O, None),
                                       ("max_batch_size", 4, F.TYPE_INT32, O, None),
                                       ("input", 5, F.TYPE_MESSAGE, R, ".inference.ModelInput"),
                                       ("output", 6, F.TYPE_MESSAGE, R, ".inference.ModelOutput"),
                                       ("instance_group", 7, F.TYPE_MESSAGE, R, ".inference.ModelInstanceGroup"),
                                       ("default_model_filename", 8, F.TYPE_STRING, O, None),
                                       ("dynamic_batching", 11, F.TYPE_MESSAGE, O, ".inference.ModelDynamicBatching"),
                                       ("parameters", 14, F.TYPE_MESSAGE, R, ".inference.ModelConfig.ParametersEntry"),
                                       ("backend", 17, F.TYPE_STRING, O, None)])
    # map<string, ModelParameter> parameters = 14: a repeated nested entry message marked map_entry.
    entry = cfg.nested_type.add(name="ParametersEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=O)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=O, type_name=".inference.ModelParameter")


def model_config_subset():
    """inference.ModelConfig (the fields we write), built from a descriptor once."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="overdrive_triton_model_config.proto", package="inference",
                                            syntax="proto3")
    dt = fd.enum_type.add(name="DataType")
    for i, n in enumerate(DATA_TYPES):
        dt.value.add(name=n, number=i)
    _tensor_messages(fd, F)
    _scheduling_messages(fd, F)
    _config_message(fd, F)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    _CLASS = message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))
    return _CLASS
