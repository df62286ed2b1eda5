"""Regenerate tests/te_api.py: Transformer Engine's PyTorch API per release, parsed from its source.

    git clone https://github.com/NVIDIA/TransformerEngine /tmp/te
    python scripts/te_api_table.py /tmp/te v2.0 v2.1 ... v2.18 > tests/te_api.py
(then restore the module docstring from git). Parses, with `ast`, te.Linear.__init__/forward
(pytorch/module/linear.py, and its `@no_torch_dynamo()` line), te.fp8_autocast/te.autocast (pytorch/fp8.py
or pytorch/quantization.py; autocast is a class from v2.16), the recipe classes (common/recipe/__init__.py)
and te.LayerNorm.__init__ (pytorch/module/layernorm.py) at each tag."""

import ast
import subprocess
import sys


def _show(repo: str, tag: str, path: str) -> str | None:
    r = subprocess.run(["git", "-C", repo, "show", f"{tag}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    out = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        out.append("*")
    out += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return out


def _find(src: str, cls: str | None, meth: str):
    tree = ast.parse(src)
    for n in tree.body:
        if cls is None and isinstance(n, ast.FunctionDef) and n.name == meth:
            return _params(n), n.lineno
        if isinstance(n, ast.ClassDef) and n.name == cls:
            for m in n.body:
                if isinstance(m, ast.FunctionDef) and m.name == meth:
                    return _params(m), m.lineno
    return None


def row(repo: str, tag: str) -> dict:
    lin = _show(repo, tag, "transformer_engine/pytorch/module/linear.py")
    d = {"commit": subprocess.run(["git", "-C", repo, "rev-parse", tag + "^{commit}"], capture_output=True,
                                  text=True).stdout.strip()}
    init, fwd = _find(lin, "Linear", "__init__"), _find(lin, "Linear", "forward")
    nodyn = [i + 1 for i, line in enumerate(lin.splitlines()) if "@no_torch_dynamo()" in line][0]
    ac = fp8ac = None
    for f in ("transformer_engine/pytorch/quantization.py", "transformer_engine/pytorch/fp8.py"):
        src = _show(repo, tag, f)
        if not src:
            continue
        fp8ac = fp8ac or (_find(src, None, "fp8_autocast"), f.rsplit("/", 1)[-1])
        a = _find(src, None, "autocast") or _find(src, "autocast", "__init__")
        if a and a[0][:1] == ["self"]:
            a = (a[0][1:], a[1])
        ac = ac or a
    rec = ast.parse(_show(repo, tag, "transformer_engine/common/recipe/__init__.py"))
    ln = _find(_show(repo, tag, "transformer_engine/pytorch/module/layernorm.py"), "LayerNorm", "__init__")
    d.update(lines={"linear.py": (init[1], nodyn, fwd[1]), fp8ac[1]: (fp8ac[0][1], ac[1] if ac else None)},
             linear_init=tuple(init[0]), linear_forward=tuple(fwd[0]), fp8_autocast=tuple(fp8ac[0][0]),
             autocast=tuple(ac[0]) if ac else None,
             recipes=tuple(n.name for n in rec.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")),
             norm_init=tuple(ln[0]))
    return d


if __name__ == "__main__":
    repo, tags = sys.argv[1], sys.argv[2:]
    print('"""Transformer Engine\'s PyTorch API per release (scripts/te_api_table.py)."""\n\nTE_API = {')
    for t in tags:
        print(f'    "{t.lstrip("v")}": {{')
        for k, v in row(repo, t).items():
            print(f'        "{k}": {v!r},')
        print("    },")
    print("}")
