"""A GPU MODE problem's Python, read without running it: how its eval.py parses the specs, how its reference checks
outputs, which of its inputs are output buffers, what its code needs of the machine, and whether its inputs are drawn
on the CPU.

Every rule here reads the problem's own code (its ASTs); none runs it. ``gpumode.materialise_gpumode`` writes what
they find into the task folder.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from typing import Any

from ksearch_graph.tasks.task import TaskError

# The spec regex of GPU MODE's eval.py files that say nothing else: a key of letters, a value of letters or an integer.
DEFAULT_SPEC_PATTERN = r"\s*([a-zA-Z]+):\s*([a-zA-Z]+|[+-]?[0-9]+)\s*"
ALLOCATORS = {"empty", "empty_like", "zeros", "zeros_like", "empty_strided"}
UNDEFINED = {"empty", "empty_like", "empty_strided"}  # content undefined upstream: poisoned here (gpumode.py)
NEUTRAL_MODULES = {"torch", "numpy", "triton", "__future__"}  # what every evaluation host has


# ---------------------------------------------------------------------------------------------------- the specs


@dataclass(frozen=True)
class SpecParser:
    """eval.py's ``get_test_cases``: the regex each ``key: value`` part must match, whether bracketed lists of
    integers become tuples (the grouped GEMM's eval.py), and where that was read."""

    pattern: str = DEFAULT_SPEC_PATTERN
    tuples: bool = False
    source: str = "GPU MODE's usual spec regex"

    def parse(self, spec: dict, where: str) -> dict[str, Any]:
        """The keyword arguments eval.py passes to generate_input for one task.yml spec: its runner writes the spec
        as ``key: value; ...`` (str() of each YAML value), eval.py splits on ';', matches each part, turns integers
        into int (and bracketed integer lists into tuples where it does) and keeps every other value as the string
        it was written as: YAML's False arrives as "False", which is truthy."""
        args: dict[str, Any] = {}
        for part in spec_line(spec).split(";"):
            matched = re.fullmatch(self.pattern, part)
            if not matched:
                raise TaskError(f"{where}: the problem's eval.py rejects the spec part '{part.strip()}' (it must "
                                f"match {self.pattern}, {self.source})")
            value: Any = matched[2]
            try:
                value = int(value)
            except ValueError:
                if self.tuples and value[:1] + value[-1:] in ("[]", "()"):
                    try:
                        inner = value[1:-1].strip()
                        value = tuple(int(x.strip()) for x in inner.split(",")) if inner else ()
                    except ValueError:
                        pass
            args[matched[1]] = value
        return args


def spec_line(spec: dict) -> str:
    """One spec as GPU MODE's runner writes it into the file eval.py reads: ``key: value; key: value``."""
    return "; ".join(f"{k}: {v}" for k, v in spec.items())


def spec_parser(eval_source: str | None, name: str) -> SpecParser:
    """How the problem's eval.py parses specs: the string its ``get_test_cases`` matches parts with, and whether it
    converts bracketed values to tuples. Without an eval.py, or one without that function: the usual regex."""
    if not eval_source:
        return SpecParser()
    try:
        tree = ast.parse(eval_source)
    except SyntaxError:
        return SpecParser()
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_test_cases"), None)
    if fn is None:
        return SpecParser()
    strings = {t.id: n.value.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
               and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str) for t in n.targets
               if isinstance(t, ast.Name)}
    pattern = None
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in (
                "match", "fullmatch") and getattr(call.func.value, "id", None) == "re" and call.args:
            first = call.args[0]
            pattern = strings.get(first.id) if isinstance(first, ast.Name) else getattr(first, "value", None)
            if isinstance(pattern, str):
                break
    if not isinstance(pattern, str):
        return SpecParser()
    try:
        re.compile(pattern)
    except re.error:
        return SpecParser()
    tuples = any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "tuple" for c in ast.walk(fn))
    return SpecParser(pattern, tuples, f"{name}'s get_test_cases")


# ---------------------------------------------------------------------------------------------------- the checker


def _number(node: ast.expr, where: str) -> float:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        value = None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TaskError(f"{where}: the tolerance must be a number literal")
    return float(value)


def match_reference_defaults(utils_source: str | None, defaults: dict[str, float]) -> dict[str, float]:
    """match_reference's rtol/atol defaults in the problem's utils.py, where it has one."""
    tol = dict(defaults)
    try:
        tree = ast.parse(utils_source or "")
    except SyntaxError:
        return tol
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "match_reference":
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            for arg, default in zip(args, node.args.defaults):
                if arg.arg in tol:
                    tol[arg.arg] = _number(default, f"utils.py: match_reference's {arg.arg}")
    return tol


def checker(tree: ast.Module, where: str, utils_source: str | None,
            defaults: dict[str, float]) -> tuple[str, dict[str, float] | None]:
    """("match_reference", {atol, rtol}) for ``check_implementation = make_match_reference(ref_kernel, rtol=,
    atol=)``, compared elementwise by the judge; ("own", None) for any other check_implementation, run as it is."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check_implementation":
            found = "own"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "check_implementation" for t in targets):
                call = node.value
                if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "make_match_reference"
                        and call.args and getattr(call.args[0], "id", None) == "ref_kernel"):
                    tol = match_reference_defaults(utils_source, defaults)
                    for kw in call.keywords:
                        if kw.arg in tol:
                            tol[kw.arg] = _number(kw.value, f"{where}: make_match_reference's {kw.arg}")
                    found = ("match_reference", tol)
                else:
                    found = "own"
    if found is None:
        raise TaskError(f"{where} defines no check_implementation (GPU MODE's eval.py calls it on every output)")
    return found if isinstance(found, tuple) else ("own", None)


# ---------------------------------------------------------------------------------------------------- output buffers


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _unwrap(node: ast.expr) -> ast.expr:
    """``torch.empty(...).contiguous()`` -> ``torch.empty(...)``."""
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args
           and node.func.attr in ("contiguous", "cuda")):
        node = node.func.value
    return node


def _allocator(node: ast.expr) -> str | None:
    """The torch allocator a value comes from (torch.empty, ...), or None."""
    node = _unwrap(node)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ALLOCATORS
            and getattr(node.func.value, "id", None) == "torch"):
        return node.func.attr
    return None


def _returned(fn: ast.FunctionDef) -> list[ast.expr] | None:
    """The elements of generate_input's returned tuple (its last return), or None."""
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
    if not returns:
        return None
    value = returns[-1].value
    return list(value.elts) if isinstance(value, ast.Tuple) else None


def _module_classes(tree: ast.Module) -> set[str]:
    """The problem's own nn.Module subclasses: an instance among the inputs carries state a call may change."""
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef) and any(
        (isinstance(b, ast.Attribute) and b.attr == "Module") or getattr(b, "id", None) == "Module" for b in n.bases)}


class _Bindings(ast.NodeVisitor):
    """In ref_kernel: which names hold which part of its ``data`` argument (a path of positions, "*" for every
    element of a sequence), and which of those it writes into."""

    def __init__(self, data: str):
        self.paths: dict[str, tuple] = {data: ()}
        self.written: list[tuple] = []

    def bind(self, target: ast.expr, path: tuple | None) -> None:
        if isinstance(target, ast.Name):
            if path is None:
                self.paths.pop(target.id, None)
            else:
                self.paths[target.id] = path
        elif isinstance(target, (ast.Tuple, ast.List)):
            starred = next((i for i, t in enumerate(target.elts) if isinstance(t, ast.Starred)), len(target.elts))
            for i, t in enumerate(target.elts):  # positions after a *rest are not known here
                self.bind(t.value if isinstance(t, ast.Starred) else t,
                          None if path is None or i >= starred else path + (i,))

    def path_of(self, node: ast.expr) -> tuple | None:
        if isinstance(node, ast.Name):
            return self.paths.get(node.id)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                node.slice.value, (int, str)) and not isinstance(node.slice.value, bool):
            base = self.path_of(node.value)
            return None if base is None else base + (node.slice.value,)
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            if isinstance(target, ast.Subscript):  # buf[...] = value
                path = self.path_of(target.value)
                if path is not None:
                    self.written.append(path)
            else:
                self.bind(target, self.path_of(node.value))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:  # buf += value: in place on a tensor
        self.generic_visit(node)
        target = node.target.value if isinstance(node.target, ast.Subscript) else node.target
        path = self.path_of(target)
        if path is not None:
            self.written.append(path)

    def visit_For(self, node: ast.For) -> None:
        it = node.iter
        target = node.target
        if isinstance(it, ast.Call) and getattr(it.func, "id", None) == "enumerate" and it.args and isinstance(
                target, ast.Tuple) and len(target.elts) == 2:
            it, target = it.args[0], target.elts[1]
        if isinstance(it, ast.Call) and getattr(it.func, "id", None) == "zip" and isinstance(target, ast.Tuple):
            for sub, seq in zip(target.elts, it.args):
                base = self.path_of(seq)
                self.bind(sub, None if base is None else base + ("*",))
        else:
            base = self.path_of(it)
            self.bind(target, None if base is None else base + ("*",))
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    def visit_Return(self, node: ast.Return) -> None:  # an input handed back as the output: a buffer it fills
        self.generic_visit(node)
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value] if node.value else []
        self.written += [p for p in map(self.path_of, values) if p is not None]

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_"):
            path = self.path_of(func.value)  # buf.copy_(...), buf.zero_(), ...
            if path is not None:
                self.written.append(path)
        for kw in node.keywords:
            if kw.arg == "out":
                path = self.path_of(kw.value)
                if path is not None:
                    self.written.append(path)


def _written(fn: ast.FunctionDef | None) -> list[tuple]:
    """Paths in a function's first argument that it writes into or returns."""
    if fn is None or not fn.args.args:
        return []
    bindings = _Bindings(fn.args.args[0].arg)
    for stmt in fn.body:
        bindings.visit(stmt)
    return [p for p in bindings.written if p]


def output_buffers(tree: ast.Module, template: ast.Module | None = None) -> tuple[list[tuple], list[tuple]]:
    """(paths in ``data`` of the inputs a call may write, those among them GPU MODE allocates uninitialised).

    An input is an output buffer where the reference's ref_kernel or the template's custom_kernel writes into it
    (``buf[...] = ``, ``buf.copy_()``, ``out=buf``) or returns it, where generate_input returns a fresh allocation
    (torch.empty/zeros and their _like forms) it uses nowhere else, or where it is an instance of the problem's own
    nn.Module (a KV cache a call fills)."""
    gen = _function(tree, "generate_input")
    writable = _written(_function(tree, "ref_kernel"))
    if template is not None:
        writable += _written(_function(template, "custom_kernel"))
    undefined: list[tuple] = []
    elements = _returned(gen) if gen is not None else None
    if elements:
        assigned = {t.id: n.value for n in ast.walk(gen) if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
        uses: dict[str, int] = {}
        for n in ast.walk(gen):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                uses[n.id] = uses.get(n.id, 0) + 1
        classes = _module_classes(tree)
        for i, element in enumerate(elements):
            value = assigned.get(element.id) if isinstance(element, ast.Name) else element
            if value is None:
                continue
            alloc = _allocator(value)
            only_returned = not isinstance(element, ast.Name) or uses.get(element.id, 0) == 1
            core = _unwrap(value)
            while isinstance(core, ast.Call) and isinstance(core.func, ast.Attribute) and core.func.attr == "to":
                core = core.func.value
            stateful = isinstance(core, ast.Call) and getattr(core.func, "id", None) in classes
            if (alloc and only_returned) or stateful:
                writable.append((i,))
            if alloc in UNDEFINED and (i,) in writable:
                undefined.append((i,))
    return sorted(set(writable), key=writable.index), undefined


def path_text(path: tuple) -> str:
    """(0, 2) in ``data`` -> "inputs[0][0][2]": make_inputs returns ``(data,)``."""
    return "inputs[0]" + "".join(f"[{p!r}]" if isinstance(p, str) and p != "*" else f"[{p}]" for p in path)


# ---------------------------------------------------------------------------------------------------- the machine


def _imports(tree: ast.Module) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names.add(n.module.split(".")[0])
    return names


def _attributes(tree: ast.Module) -> set[str]:
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def _makes_cuda_tensors(tree: ast.Module) -> bool:
    """A "cuda" device written into the code (device="cuda", .to("cuda"), torch.Generator(device='cuda'), .cuda())."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"cuda(:\d+)?", n.value):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cuda":
            return True
    return False


def requirements(trees: dict[str, ast.Module]) -> dict:
    """What the problem's code (``{file name: tree}``) needs of the machine, for task.json's "requires"."""
    own = {name.removesuffix(".py") for name in trees}
    imported = set().union(*(_imports(t) for t in trees.values())) - own - NEUTRAL_MODULES
    modules = sorted(m for m in imported if m not in sys.stdlib_module_names)
    attributes = set().union(*(_attributes(t) for t in trees.values()))
    req: dict[str, Any] = {}
    why = []
    reference = trees.get("reference.py")
    if reference is not None and _makes_cuda_tensors(reference):
        req["device"] = "cuda"
        why.append("its generate_input makes its tensors on \"cuda\"")
    if "aiter" in modules:
        req["rocm"] = True
        why.append("its reference calls AMD's aiter kernels (ROCm)")
    if {"_scaled_mm", "float4_e2m1fn_x2"} <= attributes:
        req["compute_capability"] = [10, 0]
        why.append("its reference runs NVFP4 block-scaled GEMMs through torch._scaled_mm, which needs Blackwell "
                   "(compute capability 10.0)")
    if modules:
        req["python_modules"] = modules
        why.append(f"it imports {', '.join(modules)}")
    if why:
        req["why"] = "; ".join(why)
    return req


# ---------------------------------------------------------------------------------------------------- CPU sampling


def samples_on_cpu(tree: ast.Module) -> bool:
    """generate_input draws from a torch.distributions distribution made from plain numbers (sampled on the CPU,
    then copied: TriMul's Cauchy input is 3.2 GB, seconds per call), and gives every other tensor it makes an
    explicit device: run under torch.device(device), it samples on the device and changes nothing else."""
    gen = _function(tree, "generate_input")
    if gen is None:
        return False
    draws = False
    for n in ast.walk(gen):
        if not isinstance(n, ast.Call):
            continue
        func = n.func
        dotted = ast.unparse(func) if isinstance(func, ast.Attribute) else ""
        if dotted.startswith("torch.distributions.") and all(isinstance(a, ast.Constant) for a in n.args):
            draws = True
        elif (isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "torch"
              and func.attr in FACTORIES and not any(k.arg == "device" for k in n.keywords)):
            return False
    return draws


FACTORIES = {"randn", "rand", "randint", "randperm", "empty", "zeros", "ones", "full", "tensor", "arange",
             "linspace", "eye", "as_tensor", "normal", "empty_strided"}
