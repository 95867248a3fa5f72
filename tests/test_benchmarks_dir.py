"""benchmarks/ holds only what BENCHMARKS.md cites, and its Python scripts import with the package's layout."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _cited() -> set:
    """``benchmarks/<name>`` tokens of BENCHMARKS.md (``*`` stands for a family, e.g. ``..._r*_...json``)."""
    return set(re.findall(r"benchmarks/([\w.*\-]+)", (ROOT / "BENCHMARKS.md").read_text()))


def test_every_file_in_benchmarks_is_cited():
    cited = _cited()
    uncited = [p.name for p in sorted(BENCH.iterdir()) if not any(fnmatch.fnmatch(p.name, c) for c in cited)]
    assert not uncited, f"cite these in BENCHMARKS.md or delete them: {uncited}"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_benchmark_script_imports(script, monkeypatch):
    """Importing runs the script's imports (``mla_sink.paths.triton.launch``, ``mla_sink.core.reference``,
    ...) and nothing else: every script keeps its work under ``if __name__ == "__main__"``."""
    pytest.importorskip("triton")  # every script times or checks a Triton kernel
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their helpers (tree_ab, ...) as run from there
    spec = importlib.util.spec_from_file_location(f"_bench_{script[:-3]}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{script} has no main()"


def test_every_benchmarks_file_cited_in_tables_code_and_docs_exists():
    """A ``benchmarks/<name>`` cited by a table row, the package, README.md or BENCHMARKS.md is in the tree
    (``*`` families match at least one file), unless it is cited from the history (``<commit>:benchmarks/..``)."""
    texts = [p.read_text() for p in (ROOT / "tables").glob("*.yaml")]
    texts += [p.read_text() for p in (ROOT / "mla_sink").rglob("*.py")]
    texts += [(ROOT / name).read_text() for name in ("README.md", "BENCHMARKS.md")]
    names = {n.rstrip(".") for t in texts for n in re.findall(r"benchmarks/([\w.*\-]+)", t)}
    # kept in the history, not in the tree: cited as ``git show <commit>:benchmarks/<name>``
    names -= {n for t in texts for n in re.findall(r"[0-9a-f]{7,40}:benchmarks/([\w.*\-]+)", t)}
    files = [p.name for p in BENCH.iterdir()]
    missing = sorted(n for n in names if n and not any(fnmatch.fnmatch(f, n) for f in files))
    assert not missing, f"cited but not in benchmarks/: {missing}"


def test_cols_timeline_patch_fits_the_current_kernel():
    """``benchmarks/cols_timeline.py`` stamps the current ``gluon_fp8`` source: every anchor it patches is there
    (its ``sub`` asserts each one), and every stamp it adds lands in the source (the stores of each part's words)."""
    import sys
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("_bench_cols_timeline_patch", BENCH / "cols_timeline.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    src = (ROOT / "mla_sink" / "kernels" / "gluon" / "gluon_fp8.py").read_text()
    patched = module.patch(src)
    for words in ("+ 16 + 3 * i", "+ 256 + 4 * i", "+ 384 + 3 * i", "+ 6 + ROLE", "+ 8,"):
        assert words in patched, words
    assert patched.count("_now(") > src.count("_now(") + 20
