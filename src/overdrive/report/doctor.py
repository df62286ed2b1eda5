"""Render the environment report as tables grouped by section, then the verdict in words."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from overdrive.env import EnvReport
from overdrive.formats import kinds
from overdrive.report.console import wide_console

__all__ = ["render_doctor"]

_STYLE = {"ok": "green", "missing": "yellow", "broken": "bold red", "unsupported": "cyan"}


def _e(v) -> str:
    """Probed or cached text (a CPU model, a GPU name, a compiler path) as literal console text."""
    return escape(str(v))


def _gib(b: int | None) -> str:
    return f"{b / 2**30:.1f} GiB" if b else "?"


def render_doctor(rep: EnvReport, console: Console | None = None) -> None:
    c = console or wide_console()
    cpu, tc, t = rep.platform["cpu"], rep.toolchain, rep.torch

    plat = Table(title="Platform", show_header=False, title_justify="left", expand=False)
    plat.add_column(style="bold")
    plat.add_column()
    plat.add_row("OS", _e(rep.platform["os"].get("platform", rep.platform["os"].get("system", "?"))))
    flags = [k for k, v in cpu.get("flags", {}).items() if v]
    plat.add_row("CPU", _e(f"{cpu.get('model')} · {cpu.get('count')} cores · ISA used by torch: "
                           f"{cpu.get('isa') or '?'}"))
    plat.add_row("CPU flags", _e(", ".join(flags) or "none of avx2/avx512/amx"))
    rates = cpu.get("matmul_gflops") or {}
    if rates:
        plat.add_row("CPU matmul (1 core, best warm)",
                     _e(" · ".join(f"{k} {v:.0f} GFLOP/s" for k, v in rates.items())))
    plat.add_row("RAM", _e(_gib(cpu.get("ram_bytes"))))
    plat.add_row("Python", _e(rep.platform["python"].get("version", "?")))
    build = {"cpu": "CPU-only build", "cuda": f"CUDA {t.get('cuda')} build", "rocm": f"ROCm {t.get('hip')} build"}
    plat.add_row("torch", _e(f"{t.get('version')} ({build.get(t.get('build'), '?')})"))
    plat.add_row("CUDA driver", _e(tc.get("driver") or "none (no nvidia-smi)"))
    plat.add_row("cuDNN / NCCL", _e(f"{t.get('cudnn') or '-'} / {t.get('nccl') or '-'}"))
    plat.add_row("nvcc", _e(f"{tc.get('nvcc')} (CUDA {tc.get('nvcc_version')})" if tc.get("nvcc") else
                 "not on PATH (needed to build Transformer Engine or Apex)"))
    plat.add_row("cuDNN headers",
                 _e(tc.get("cudnn_header") or "cudnn.h not found (needed to build Transformer Engine)"))
    plat.add_row("C++ compiler", _e(tc.get("c_compiler") or "none (torch.compile on CPU needs one)"))
    c.print(plat)

    if rep.gpus:
        g = Table(title="GPUs", title_justify="left")
        lowp = kinds()  # one column per low-precision format's capability (`overdrive.formats`)
        for col in ("#", "name", "SM", "memory", "SMs", "tf32", "bf16", *lowp, "BF16 peak", "FP8 peak", "HBM"):
            g.add_column(col)
        yes = lambda b: "[green]yes[/]" if b else "[dim]no[/]"  # noqa: E731
        for gpu in rep.gpus:
            cap, spec = gpu.capabilities, gpu.spec
            g.add_row(str(gpu.index), _e(gpu.name), f"{gpu.cc[0]}.{gpu.cc[1]}", f"{gpu.mem_gib:.1f} GiB",
                      str(gpu.sm_count), yes(cap["tf32"]), yes(cap["bf16"]), *(yes(cap.get(k)) for k in lowp),
                      f"{spec.bf16_tflops:.0f} TFLOP/s" if spec else "not in catalog",
                      f"{spec.fp8_tflops:.0f} TFLOP/s" if spec and spec.fp8_tflops else "-",
                      f"{spec.hbm_tbs} TB/s" if spec else "-")
        c.print(g)
    else:
        msg = t.get("cuda_error") or ("CUDA build, but no GPU visible" if t.get("build") == "cuda" else "no CUDA GPU")
        c.print(f"[bold]GPUs[/]: none — {_e(msg)}")

    e = Table(title="Engines", title_justify="left")
    for col in ("engine", "status", "version", "reason", "fix"):
        e.add_column(col, overflow="fold")
    for st in rep.engines.values():
        e.add_row(_e(st.name), f"[{_STYLE.get(st.status, 'bold')}]{_e(st.status)}[/]", _e(st.version or ""),
                  _e(st.reason), _e(st.fix))
    c.print(e)

    c.print("[bold]Verdict[/] (what the probes expect)")
    for line in rep.verdict:
        c.print(f"  {escape(line)}")
    from overdrive.bench.findings import findings_lines, load_findings

    found = load_findings(rep)
    if found:
        c.print(f"[bold]Measured here[/] by `overdrive bench` (suite {_e(found.get('suite'))}, {_e(found.get('created'))})")
        for line in findings_lines(found):
            c.print(f"  {_e(line)}")
    else:
        c.print("[bold]Measured here[/]: nothing yet — `overdrive bench` measures what each recipe costs on this "
                "machine, and the doctor shows it here after")
