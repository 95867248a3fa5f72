"""Quirks live in tables/ only: no arch name, dtype rule or head-count literal in the Python code.

Scanned: every module of ``mla_sink/`` and ``dispatch/`` except the float64 reference (which defines
the semantics). Comments and docstrings may name archs, dtypes and head counts; code may not:

* an arch name in a string constant that is nothing else: a target (``gfx942``, ``sm90``), a prefix of one
  (``"sm9"``, ``"gfx9"``, as ``arch.startswith("sm9")`` uses it) or a family (``hopper``, ``blackwell``,
  ``cdna3``, ``mi300x``, any case); messages may name archs inside longer text;
* a dtype rule: a comparison (``==``, ``!=``, ``in``, ``not in``) against a dtype key (``"bf16"``,
  ``"fp8_e4m3"``, ...) or a half/fp8 torch dtype (``torch.bfloat16``, ``torch.float8_e4m3fn``, ...), or of a
  dtype's size (``.itemsize``, ``.element_size()``) with an integer literal;
* a head-count literal: a comparison of a head count (a name with "head" in it, or ``H``) with an
  integer other than 0 and 1, or such a literal given to ``min``/``max`` beside a head count;
* a size threshold: the same of an id or token count (a name with "topk" or "token" in it, or ``T``), and a
  remainder (``%``) of a head, id or token count by such a literal (``topk % 16``: the seesaw's stride rule, a
  ``multiple_of`` condition of ``tables/triton_tuning.yaml`` since the forty-second session). A module-level
  constant bound to an integer literal in the same module (``ALIGN = 16``) counts as that literal, unless it is
  one of :data:`REVIEWED_CONSTANTS`, each with the reason it is no quirk (a constant imported from another module
  is not followed);
* a rule table in code: a module-level dict literal keyed by dtype keys (``{"fp8_e4m3": ...}``) or by integer
  head counts (``{16: ..., 32: ...}``) whose values hold literals (numbers, strings, tuples of them). A pure
  vocabulary mapping, each key to a named constant (``{"bf16": KV_HALF.value}``, a kernel's format code), is not
  a rule and passes.

The tables say which arch, dtype and head count takes which path and kernel; the dtype vocabulary
(``mla_sink/core/dtypes.py``) maps torch dtypes to the keys the tables use.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = sorted(p for d in ("mla_sink", "dispatch") for p in (ROOT / d).rglob("*.py")
                 if p.relative_to(ROOT).as_posix() != "mla_sink/core/reference.py")
ARCH = re.compile(r"^(gfx\d{1,4}[a-z]?|sm_?\d{1,3}[a-z]?|hopper|blackwell|ampere|cdna\d?|mi\d{3}[a-z]?)$",
                  re.IGNORECASE)
DTYPE_KEYS = {"bf16", "fp16", "fp8_e4m3", "fp8_e4m3fnuz", "fp8_ds_mla"}
TORCH_DTYPES = {"bfloat16", "float16", "half", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}
HEAD = re.compile(r"(^H$|head)", re.IGNORECASE)
SIZE = re.compile(r"(^T$|topk|token)", re.IGNORECASE)
#: Module-level int constants compared with head / id / token counts that were reviewed and are no quirk.
REVIEWED_CONSTANTS = {
    "MIN_BLOCK_H": "the portable and combine kernels' smallest head tile (tl.dot's M floor in the Triton releases they "
                   "were written for), on every target alike: it sizes tiles, it routes no call",
}


def _docstrings(tree: ast.AST) -> set:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _names(node: ast.AST) -> set:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _constants(node: ast.AST) -> list:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _constants(e)]
    return [node]


def _is_dtype_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in DTYPE_KEYS
    return (isinstance(node, ast.Attribute) and node.attr in TORCH_DTYPES and isinstance(node.value, ast.Name)
            and node.value.id == "torch")


def _is_dtype_size(node: ast.AST) -> bool:
    """``x.itemsize`` or ``x.element_size()``: a dtype's size, which compared with a literal is a dtype rule."""
    if isinstance(node, ast.Call):
        node = node.func
        return isinstance(node, ast.Attribute) and node.attr == "element_size"
    return isinstance(node, ast.Attribute) and node.attr == "itemsize"


def _is_count(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and type(node.value) is int and node.value not in (0, 1)) or (
        isinstance(node, ast.UnaryOp) and _is_count(node.operand))


def _is_head(node: ast.AST) -> bool:
    return any(HEAD.search(n) for n in _names(node))


def _is_size(node: ast.AST) -> bool:
    return any(SIZE.search(n) for n in _names(node))


def _is_reference(node: ast.AST) -> bool:
    """A named constant: ``NAME`` or ``a.b.c`` (vocabulary), not a literal."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _named_counts(tree: ast.Module) -> frozenset:
    """Module-level names bound to an integer literal other than 0 and 1 (``NAME = 16``, ``NAME: int = 16``), less
    :data:`REVIEWED_CONSTANTS`."""
    names = set()
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) else []
        if getattr(stmt, "value", None) is not None and _is_count(stmt.value):
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(names - set(REVIEWED_CONSTANTS))


def _rule_dict(node: ast.AST) -> str | None:
    """What kind of keys make the dict literal ``node`` a rule table (``"dtype"`` / ``"head-count"``), or None."""
    if not isinstance(node, ast.Dict) or not node.keys or None in node.keys:
        return None
    if all(_is_reference(v) for v in node.values):  # vocabulary: each key names a constant
        return None
    keys = node.keys
    if all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys) and any(
            k.value in DTYPE_KEYS for k in keys):
        return "dtype"
    if all(_is_count(k) for k in keys):
        return "head-count"
    return None


def findings(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for every quirk written in the code of ``path`` (named relative to ``root``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstrings(tree)
    rel = path.relative_to(root).as_posix()
    found = []
    for stmt in tree.body:  # module-level tables: NAME = {...} / NAME: type = {...}
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        kind = _rule_dict(value) if value is not None else None
        if kind:
            found.append(f"{rel}:{stmt.lineno}: {kind}-keyed rule table {ast.unparse(value)[:60]!r}")
    named = _named_counts(tree)

    def is_count(node: ast.AST) -> bool:  # a literal, or a module constant bound to one
        return _is_count(node) or (isinstance(node, ast.Name) and node.id in named)

    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for word in re.findall(r"[A-Za-z0-9_]+", node.value):
                if ARCH.match(word) and node.value.strip() == word:
                    found.append(f"{where}: arch name {word!r}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = [c for s in sides for c in _constants(s)]
            if any(_is_dtype_literal(c) for c in consts) or (
                    any(_is_dtype_size(s) for s in sides)
                    and any(isinstance(c, ast.Constant) and type(c.value) is int for c in consts)):
                found.append(f"{where}: dtype rule {ast.unparse(node)!r}")
            if any(is_count(c) for c in consts) and any(_is_head(s) for s in sides if not is_count(s)):
                found.append(f"{where}: head-count literal {ast.unparse(node)!r}")
            elif any(is_count(c) for c in consts) and any(_is_size(s) for s in sides if not is_count(s)):
                found.append(f"{where}: size threshold {ast.unparse(node)!r}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and is_count(node.right) and (
                _is_head(node.left) or _is_size(node.left)):
            found.append(f"{where}: size threshold {ast.unparse(node)!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            if any(is_count(a) for a in node.args) and any(_is_head(a) for a in node.args if not is_count(a)):
                found.append(f"{where}: head-count literal {ast.unparse(node)!r}")
    return found


def test_the_scan_sees_the_package():
    assert len(SCANNED) > 30 and any(p.name == "plan.py" for p in SCANNED)


def test_the_scan_catches_each_kind_of_quirk(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""gfx942 in a docstring is fine."""\n'
                   'def f(arch, q_dtype, num_heads, q):\n'
                   '    """sm90, bf16 and 16 heads may be named here."""\n'
                   '    a = arch == "gfx950"\n'
                   '    b = q_dtype in ("bf16", "fp16")\n'
                   '    c = q.dtype == torch.float8_e4m3fnuz\n'
                   '    d = num_heads <= 16\n'
                   '    e = max(num_heads, 16)\n'
                   '    f = arch.startswith("sm9") or "Hopper" == arch\n'
                   '    g = q.dtype.itemsize == 1\n'
                   '    return a, b, c, d, e, f, g, num_heads > 0, f"{arch} is not sm90"\n'
                   'def g(topk, num_tokens, T, stride, block_n):\n'
                   '    return topk % 16, num_tokens <= 8, T > 2, topk % block_n, stride % 16, T == 0\n'
                   'ALIGN = 16\n'
                   'MIN_BLOCK_H = 16\n'
                   'def h(topk, num_heads):\n'
                   '    return topk % ALIGN, max(MIN_BLOCK_H, num_heads), num_heads >= MIN_BLOCK_H\n'
                   'REGS = {16: (136, 152), 32: (200, 112)}\n'
                   'FORMATS: dict = {"fp8_e4m3": (False, (torch.bfloat16,)), "fp8_ds_mla": (True, ())}\n'
                   'BY_KV = {"fp8_e4m3": 80}\n'
                   'VOCABULARY = {"bf16": KV_HALF.value, "fp8_e4m3": KV_E4M3.value}\n'
                   'NAMES = {"head_block": int, "lines": bool}\n'
                   'SIZES = {656: kv_layout.LAYOUT}\n')
    got = findings(bad, tmp_path)
    kinds = [g.split(": ", 1)[1].split(" ")[0] for g in got]
    assert kinds.count("arch") == 3 and kinds.count("dtype") == 3 and kinds.count("head-count") == 2, got
    # topk % 16, num_tokens <= 8, T > 2 and topk % ALIGN (not a stride, a tile, T == 0, the reviewed MIN_BLOCK_H)
    assert kinds.count("size") == 4, got
    assert kinds.count("dtype-keyed") == 2 and kinds.count("head-count-keyed") == 1 and len(got) == 15, got


def test_the_scan_sees_the_seesaw_stride_rule_as_it_was_written():
    """The forty-first session's leak, as ``mla_sink/paths/triton/plan.py`` had it (a module constant and a remainder
    by it), is found; the table's ``multiple_of`` condition replaced it."""
    old = ("GATHER_STRIDE_ALIGN = 16\n"
           "def plan_triton_launch(topk, sel):\n"
           "    if sel.path == SEESAW and topk % GATHER_STRIDE_ALIGN:\n"
           "        return None\n")
    assert [f.split(": ", 1)[1] for f in _findings_of(old)] == ["size threshold 'topk % GATHER_STRIDE_ALIGN'"]


def _findings_of(text: str) -> list:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.py"
        path.write_text(text)
        return findings(path, Path(d))


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_quirk_in_python(path):
    assert findings(path) == []
