"""`overdrive serve REPO [--port N]` — a real Triton Inference Server on what `export` wrote, in the
foreground until SIGINT/SIGTERM; the work is in overdrive.serve.triton_server."""

from __future__ import annotations

import argparse
import signal
import time

from overdrive.errors import UserError


class _Stop(Exception):
    """SIGINT or SIGTERM arrived: leave the wait (or the start) and stop the server."""


def _raise_stop(signum, frame):
    raise _Stop(signal.Signals(signum).name)


def _already_stopping(signum, frame):
    print(f"{signal.Signals(signum).name}: already stopping tritonserver (it ends within ~20 s)", flush=True)


def _cmd_serve(args: argparse.Namespace) -> int:
    from overdrive.serve.triton_local import find_local_repository
    from overdrive.serve.triton_server import HOST, TritonServer, TritonServerError, port_taken

    if args.port is not None and not 1024 <= args.port <= 65535:
        raise UserError(f"--port must be 1024..65535, got {args.port} (omit it to take a free port)")
    repo = find_local_repository(args.repo)
    if args.port is not None and port_taken(args.port):
        raise UserError(f"port {args.port} on {HOST} is in use: pass another --port (or omit it to take a free one)")
    from overdrive.serve.triton_env import TritonEnvError, ensure_env

    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    server = None
    try:
        try:
            env = ensure_env(say=lambda m: print(m, flush=True))
        except TritonEnvError as e:
            raise UserError(str(e)) from None
        server = TritonServer(repo, port=args.port, env=env)
        try:
            server.start()
        except TritonServerError as e:
            raise UserError(str(e).splitlines()[0]) from None
        models = ", ".join(f"{m['name']} (version {m['version']})" for m in server.index())
        print(f"tritonserver {server.url}: READY {models}; KServe v2 HTTP (e.g. {server.url}/v2/models/<name>/infer); "
              f"log {server.log_path}; Ctrl-C or SIGTERM stops it", flush=True)
        while server.proc.poll() is None:  # a sleep a signal interrupts (the handler raises _Stop)
            time.sleep(0.5)
        raise UserError(f"tritonserver exited by itself ({server.proc.returncode}): see {server.log_path}")
    except _Stop as s:
        print(f"{s}: stopping tritonserver", flush=True)
    finally:
        if server is not None:
            # A second Ctrl-C must not cut the stop short: its SIGKILL of what is left would never come.
            for sig in old:
                signal.signal(sig, _already_stopping)
            server.stop()
        for sig, h in old.items():
            signal.signal(sig, h)
    print("stopped: tritonserver and its python-backend stubs have exited", flush=True)
    return 0


def register(sub) -> None:
    s = sub.add_parser("serve", help="run a real Triton Inference Server on a repository `export` wrote",
                       description="Start tritonserver (from the nvidia-pytriton wheel, in an environment the project "
                                   "makes once) on 127.0.0.1 with the python-backend variant `export` wrote "
                                   "(triton_local/: the same model.onnx run in ONNX Runtime), wait until every model "
                                   "is READY, and serve in the foreground; SIGINT/SIGTERM stop the server and "
                                   "everything it started.")
    s.add_argument("repo", metavar="REPO", help="the folder `overdrive export --out` wrote, or its triton_local/")
    s.add_argument("--port", type=int, help="HTTP port on 127.0.0.1 (default: a free one)")
    s.set_defaults(func=_cmd_serve)
