"""model.py of the python-backend variant `overdrive export` writes: the same model.onnx, run by ONNX Runtime
inside Triton's python backend (tritonserver from the nvidia-pytriton wheel has no onnxruntime backend).

This file is copied into <repo>/<name>_python/1/model.py and runs in Triton's python-backend stub, in the
execution environment `overdrive serve` makes (numpy < 2 and onnxruntime): it imports nothing of overdrive.
The dynamic batcher hands execute() several requests at once; those with the same shapes are concatenated
along the batch and run in one session call, as the onnxruntime backend does, then split back.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        so = ort.SessionOptions()
        threads = int(params.get("intra_op_thread_count") or 0)
        if threads:  # the threads the bench measured with; unset, ONNX Runtime takes every core
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in cfg["input"]]
        self.outputs = [o["name"] for o in cfg["output"]]

    def execute(self, requests):
        feeds = [[pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs] for r in requests]
        groups = {}  # requests whose non-batch shapes agree run as one batch
        for i, xs in enumerate(feeds):
            groups.setdefault(tuple(x.shape[1:] for x in xs) + tuple(str(x.dtype) for x in xs), []).append(i)
        answers = [None] * len(requests)
        for idx in groups.values():
            batch = {n: np.concatenate([feeds[i][k] for i in idx]) for k, n in enumerate(self.inputs)}
            outs = self.sess.run(self.outputs, batch)
            start = 0
            for i in idx:
                b = feeds[i][0].shape[0]
                answers[i] = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor(n, np.ascontiguousarray(o[start:start + b])) for n, o in zip(self.outputs, outs)])
                start += b
        return answers
