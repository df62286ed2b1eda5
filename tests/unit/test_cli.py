"""The command line itself: instant help, help that answers, progress, and no third-party noise."""

import argparse
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from overdrive.cli import build_parser

# One argparse-level mistake per subcommand: each must fail before any heavy import.
ARG_ERRORS = {
    "doctor": ["doctor", "--no-such-flag"],
    "bench": ["bench", "--workload", "nope"],
    "report": ["report"],
    "plan": ["plan", "--gpus", "eight"],
    "train": ["train"],
    "export": ["export", "--model", "nope"],
    "serve": ["serve", "--port", "eighty"],
    "tune": ["tune", "--budget-s", "soon"],
    "emit": ["emit", "tuned"],
}
HEAVY = ("torch", "matplotlib", "transformers", "torchao", "onnx")


def _modules_after(argv: list[str]) -> tuple[int, set[str]]:
    """Run the CLI's main in a fresh interpreter; return its exit code and the heavy modules it imported."""
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from overdrive.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                rc = main({argv!r})
            except SystemExit as e:
                rc = e.code
        print(json.dumps([rc, sorted(m for m in {HEAVY!r} if m in sys.modules)]))
    """)
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    rc, heavy = json.loads(cp.stdout.strip().splitlines()[-1])
    return rc, set(heavy)


@pytest.mark.parametrize("argv", [[], ["--help"], ["--version"], ["nope"]]
                         + [[c, "--help"] for c in ARG_ERRORS if c != "bench"]
                         + list(ARG_ERRORS.values()), ids=lambda a: " ".join(a) or "none")
def test_help_and_argument_errors_import_no_torch(argv):
    rc, heavy = _modules_after(argv)
    assert rc == (0 if not argv or argv[-1] in ("--help", "--version") else 2)
    assert not heavy, f"`overdrive {' '.join(argv)}` imported {sorted(heavy)}"


def test_every_command_has_an_argument_error_case():
    from overdrive.commands import COMMANDS

    assert set(ARG_ERRORS) == set(COMMANDS)


def test_the_package_keeps_its_public_names():
    import overdrive
    import overdrive.accelerated  # binds the submodule onto the package: the public name stays the function
    import overdrive.tuning.api  # the same for tune's package
    from overdrive.accelerated import accelerate
    from overdrive.tuning import tune

    assert overdrive.accelerate is accelerate and overdrive.tune is tune
    assert type(overdrive).__name__ == "module" and type(overdrive.tuning).__name__ == "module"  # no class swaps
    from overdrive import tune as imported

    assert imported is tune
    assert overdrive.Recipe.__name__ == "Recipe" and overdrive.get_env.__name__ == "get_env"
    assert set(overdrive.__all__) <= set(dir(overdrive))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_option_has_help_and_shows_its_default():
    parser = build_parser()
    for name, sp in _subparsers(parser).items():
        fmt = sp._get_formatter()
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = "/".join(action.option_strings) or action.dest
            assert action.help and action.help.strip(), f"overdrive {name} {flag} has no help text"
            text = fmt._get_help_string(action) % dict(vars(action), prog=sp.prog)
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in text, f"overdrive {name} {flag}: default {action.default!r} not shown in {text!r}"


def test_bench_suite_help_lists_every_registered_suite():
    from overdrive.bench.suites import SUITES
    from overdrive.bench.workloads.recsys import RECSYS_SUITES
    from overdrive.bench.workloads.inference import LATENCY_SUITES

    text = " ".join(_subparsers(build_parser())["bench"].format_help().split())
    for name in [*SUITES, *RECSYS_SUITES, *LATENCY_SUITES]:
        assert name in text, f"bench --help does not list suite {name}"
    assert "timed rounds" in text  # --rounds says what it sets


def test_report_refuses_a_third_folder(tmp_path, capsys):
    from overdrive.cli import main

    assert main(["report", str(tmp_path), str(tmp_path), str(tmp_path)]) == 2
    assert "one folder (re-render) or two (compare), got 3" in capsys.readouterr().err


def test_verbose_is_accepted_before_and_after_the_command():
    p = build_parser()
    assert p.parse_args(["-v", "doctor"]).verbose and p.parse_args(["doctor", "-v"]).verbose
    assert not p.parse_args(["doctor"]).verbose


def test_doctor_shows_each_probe_as_it_runs(monkeypatch):
    """The probe boundary is faked (instant probes); every probe is announced when it starts and ends."""
    from rich.console import Console

    import overdrive.env.probing as probing
    from overdrive.commands.doctor import PROBE_LABELS, ProbeProgress
    from overdrive.env import get_env, set_env

    ran = []
    monkeypatch.setattr(probing, "run_probe", lambda name, timeout=None: ran.append(name) or {})
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent/overdrive-test")  # do not overwrite the real cache
    buf = io.StringIO()
    try:
        with ProbeProgress(Console(file=buf, width=200)) as progress:
            get_env(refresh=True, on_probe=progress)
    finally:
        set_env(None)
    out = buf.getvalue()
    assert {"gpus", "compile", "torch_native"} <= set(ran)
    for name in ("platform", "gpus", "compile", "torch_native"):
        label = PROBE_LABELS[name]
        assert f"probing {label} ..." in out and f"{label}: done (" in out, out
    assert out.index("probing torch.compile") < out.index("torch.compile (inductor): done")


NOISE_SCRIPT = textwrap.dedent("""
    import logging, multiprocessing as mp, sys
    from overdrive.quiet import at_boundary

    def adagrad_step():
        import overdrive  # a worker: installs the filters the CLI asked for through the environment
        import torch
        emb = torch.nn.Embedding(10, 4, sparse=True)
        opt = torch.optim.Adagrad(emb.parameters())
        emb(torch.tensor([1, 2])).sum().backward()
        opt.step()  # torch: "Sparse invariant checks are implicitly disabled"

    if __name__ == "__main__":
        with at_boundary(verbose=sys.argv[1] == "-v"):
            import torch
            torch.utils._pytree._register_pytree_node(type("Box", (), {}), lambda b: ([], None),
                                                      lambda v, c: None)
            logging.getLogger("torchao").warning("Failed to load /x/torchao/_C_mxfp8.cpython-310.so: no")
            logging.getLogger("torch.utils._pytree").warning("<enum 'K'> ... register_constant() is deprecated")
            print("[torch.onnx]", "Run decompositions...")
            print("our own line")
            p = mp.get_context("spawn").Process(target=adagrad_step)
            p.start(); p.join()
            logging.getLogger("torchao").warning("an unknown torchao warning")
""")
NOISE = ("_C_mxfp8", "_register_pytree_node", "register_constant", "[torch.onnx]", "Sparse invariant checks")


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True])
def test_known_third_party_noise_is_filtered_unless_verbose(tmp_path, verbose):
    script = tmp_path / "noisy.py"
    script.write_text(NOISE_SCRIPT)
    cp = subprocess.run([sys.executable, str(script), "-v" if verbose else "-q"], capture_output=True, text=True,
                        timeout=240)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out
    assert "our own line" in cp.stdout and "an unknown torchao warning" in out  # only known noise goes
    for noise in NOISE:
        assert (noise in out) == verbose, f"{noise!r} {'missing with' if verbose else 'leaked without'} -v:\n{out}"


def test_export_with_weights_of_another_size_says_which_size_in_one_line(tmp_path, capsys):
    import torch

    from overdrive.cli import main
    from overdrive.models import GPT, gpt_config

    weights = tmp_path / "model.pt"
    torch.save(GPT(gpt_config("tiny")).state_dict(), weights)
    rc = main(["export", "--model", "gpt", "--size", "cpu-student", "--weights", str(weights),
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "does not fit a 'cpu-student' GPT" in err and "pass --size tiny" in err
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    assert main(["export", "--model", "recsys", "--weights", str(tmp_path / "junk.pt"),
                 "--out", str(tmp_path / "out")]) == 2
    assert "is not a plain state_dict" in capsys.readouterr().err
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_bare_overdrive_shows_help_and_a_stray_word_names_its_subcommand(capsys):
    from overdrive.cli import main

    assert main([]) == 0 and "COMMAND" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["plan", "--gpu", "h100-sxm", "stray"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert "plan: unrecognized arguments: stray" in err and "see overdrive plan --help" in err


API_NOISE = textwrap.dedent("""
    import logging
    import overdrive  # the Python API, no CLI boundary
    logging.getLogger("torchao").warning("Failed to load /x/torchao/_C_mxfp8.cpython-310.so: no")
    logging.getLogger("torch.utils._pytree").warning("<enum 'K'> ... register_constant() is deprecated")
    logging.getLogger("torchao").warning("an unknown torchao warning")
""")


@pytest.mark.parametrize("env", [{}, {"OVERDRIVE_QUIET": "0"}])
def test_the_python_api_filters_the_same_known_noise_as_the_cli(env):
    """`import overdrive` in a user's script used to print torchao's failed .so loads and torch's Enum warnings
    (only the CLI filtered them); OVERDRIVE_QUIET=0 shows them."""
    cp = subprocess.run([sys.executable, "-c", API_NOISE], capture_output=True, text=True, timeout=120,
                        env={**os.environ, **env})
    assert cp.returncode == 0, cp.stderr
    assert "an unknown torchao warning" in cp.stderr  # only known noise goes
    shown = env.get("OVERDRIVE_QUIET") == "0"
    assert ("_C_mxfp8" in cp.stderr) == shown and ("register_constant" in cp.stderr) == shown
