"""The A/B harness shared by the benchmark scripts that compare trees (``fp8_decode_ab.py``,
``seesaw_fixed_cost.py``, the scripts built by :func:`case_script`): each ``NAME=TREE`` variant runs in a child
process with ``TREE`` (a ``git archive`` of ``mla_sink``, ``dispatch``, ``tables``, ``pyproject.toml``, or ``.``)
first on the path, times its cases and saves its outputs; the outputs of every variant are then compared with the
first one's. The scripts that build the trees from patches share :func:`patched_trees` and :func:`trees_main`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch


#: What a tree of an A/B holds: the package, the rule tables and their reader, the tests and the project file.
TREE_PATHS = ("mla_sink", "dispatch", "tables", "tests", "pyproject.toml")


def archive_tree(commit: str, tree: str) -> str:
    """``tree`` (emptied first): :data:`TREE_PATHS` of ``commit`` (``git archive``, run from the repository).
    Returns ``tree``.

    Raises:
        subprocess.CalledProcessError: the archive or its extraction failed.
    """
    import shutil

    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    archive = subprocess.run(["git", "archive", commit, *TREE_PATHS], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def edited_tree(commit: str, tree: str, path: str, edits: list) -> str:
    """:func:`archive_tree` of ``commit`` into ``tree``, then ``edits`` applied to the file ``path`` (relative to the
    tree): each ``(old, new)`` replaces ``old``, which must occur once, or ``(old, new, count)``, ``count`` times.
    Returns ``tree``.

    Raises:
        ValueError: an edit's ``old`` does not occur as often as it must (naming the tree, the file and the text).
        subprocess.CalledProcessError: the archive failed.
    """
    archive_tree(commit, tree)
    full = os.path.join(tree, path)
    text = open(full).read()
    for old, new, *count in edits:
        want = count[0] if count else 1
        if text.count(old) != want:
            raise ValueError(f"{tree}: {old!r} occurs {text.count(old)} times in {path} (expected {want})")
        text = text.replace(old, new)
    open(full, "w").write(text)
    return tree


def build_trees(commit: str, out_dir: str, path: str, variants: dict) -> None:
    """:func:`edited_tree` ``out_dir/NAME`` for each ``NAME: edits`` of ``variants`` (edits of ``path``), each
    printed: the ``main`` of the scripts that build an A/B's trees by editing one file."""
    for name, edits in variants.items():
        print(edited_tree(commit, os.path.join(out_dir, name), path, edits))


def patched_trees(commit: str, out_dir: str, trees: dict) -> None:
    """:func:`archive_tree` ``out_dir/NAME`` of ``commit`` for each ``NAME: patches`` of ``trees``, then each patch
    (a repository-relative path, ``git diff`` form) applied to it in order (``git apply --directory``: ``out_dir``
    must lie inside the repository), each tree printed: the ``main`` of the scripts that build an A/B's trees from
    patches.

    Raises:
        subprocess.CalledProcessError: the archive, its extraction or a patch failed.
    """
    for name, patches in trees.items():
        tree = archive_tree(commit, os.path.join(out_dir, name))
        for patch in patches:
            subprocess.run(["git", "apply", f"--directory={tree}", patch], check=True)
        print(tree)


def trees_main(trees: dict, base: str = "HEAD"):
    """The ``main(out_dir="out", commit=base)`` of a script that builds ``trees`` of ``commit`` by
    :func:`patched_trees` (run from the repository root)."""
    def main(out_dir: str = "out", commit: str = base) -> None:
        patched_trees(commit, out_dir, trees)

    return main


def run_variants(module: str, variants: tuple, out_dir: str, first_args: tuple = (), rest_args: tuple = ()) -> tuple:
    """Call ``module.run_variant(name, dump, *args)`` (``module``: a script in this folder) once per ``NAME=TREE``
    in a child process whose path starts with ``TREE`` (then any FlashMLA entries of ``PYTHONPATH``); ``args``
    is ``first_args`` for the first variant, ``rest_args`` for the others. Returns ``({name: the returned
    dict}, max_abs_diff)``, where ``max_abs_diff[name][key]`` compares each later variant's saved tensors with
    the first one's (``run_variant`` saves ``{key: tensor}`` to ``dump``). With ``TREE_AB_VARIANT_TIMEOUT`` (seconds)
    in the environment, a child that runs longer is killed and its variant left out (printed), so that a variant
    that hangs (an mbarrier never completed) does not take the rest of a device call with it."""
    limit = os.environ.get("TREE_AB_VARIANT_TIMEOUT")
    here = os.path.abspath(os.path.dirname(__file__))
    results, dumps = {}, []
    for i, spec in enumerate(variants):
        name, tree = spec.split("=", 1)
        dump = os.path.join(out_dir, f"ab_{name}.pt")
        peers = [p for p in os.environ.get("PYTHONPATH", "").split(":") if "FlashMLA" in p]
        env = dict(os.environ, PYTHONPATH=":".join(os.path.abspath(p) for p in [tree] + peers))
        args = (name, dump) + (first_args if i == 0 else rest_args)
        code = (f"import sys, json; sys.path.insert(0, {here!r}); import {module} as m; "
                f"print('JSON', json.dumps(m.run_variant(*{args!r})))")
        try:
            r = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.abspath(tree), capture_output=True,
                               text=True, timeout=float(limit) if limit else None)
        except subprocess.TimeoutExpired:
            print(f"{name}: killed after TREE_AB_VARIANT_TIMEOUT={limit} s, left out (a hang?)", flush=True)
            continue
        print(r.stdout[-4000:], r.stderr[-3000:], flush=True)
        line = [x for x in r.stdout.splitlines() if x.startswith("JSON")]
        if line:
            results[name] = json.loads(line[0][len("JSON"):])
            dumps.append((name, dump))
    diffs = {}
    if dumps:
        first = torch.load(dumps[0][1])
        for name, dump in dumps[1:]:
            other = torch.load(dump)
            diffs[name] = {k: float((first[k] - other[k]).abs().max()) for k in first}
    for _, dump in dumps:
        os.remove(dump)
    return results, diffs


def cases_report(path: str, module: str, cases: list, variants: tuple) -> None:
    """The ``main`` of a script whose ``run_variant`` times a list of ``(kv_dtype, H, T)`` ``cases``
    (``fp8_decode_ab.py``, ``few_heads_ab.py``): run its variants, compare their outputs, and write ``{"cases",
    "us", "max_abs_diff_vs_first"}`` to ``path`` (and print it)."""
    report: dict = {"cases": [f"{k}-h{h}-T{t}" for k, h, t in cases]}
    report["us"], report["max_abs_diff_vs_first"] = run_variants(module, variants,
                                                                 os.path.dirname(os.path.abspath(path)))
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


def case_script(module: str, cases: list) -> tuple:
    """``(run_variant, main)`` of a script ``module`` (this folder) that times ``cases`` (``(kv_dtype, H, T)``)
    with the timing loop of :mod:`seesaw_wgmma_ab` in each ``NAME=TREE`` (``few_heads_ab.py``, ``combine_ab.py``,
    ...): ``run_variant(variant, dump)`` times the cases with the ``mla_sink`` on the path and saves the outputs to
    ``dump``; ``main(path, *variants)`` runs the variants in child processes and writes :func:`cases_report`."""
    def run_variant(variant: str, dump: str) -> dict:
        import seesaw_wgmma_ab
        return seesaw_wgmma_ab.run_variant(variant, dump, cases)

    def main(path: str, *variants: str) -> None:
        cases_report(path, module, cases, variants)

    return run_variant, main


def main(path: str, module: str, *variants: str) -> None:
    """Run ``module.run_variant`` (a script in this folder) in each ``NAME=TREE`` and write ``{"us": ...,
    "max_abs_diff_vs_first": ...}`` to ``path``:

        PYTHONPATH=. python3 -u benchmarks/tree_ab.py OUT.json fp8_decode_ab main=out/main new=.
    """
    us, diffs = run_variants(module, variants, os.path.dirname(os.path.abspath(path)))
    with open(path, "w") as f:
        json.dump({"module": module, "us": us, "max_abs_diff_vs_first": diffs}, f, indent=1)
    print(json.dumps(diffs, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
