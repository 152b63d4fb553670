#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_tree.py against small trees written here: each check passes a tree that keeps its rule and fails,
naming the file, a tree that breaks it. Usage: check_tree_selftest.py"""
import pathlib
import shutil
import subprocess
import sys
import tempfile

CHECKER = pathlib.Path(__file__).with_name("check_tree.py")
ROOTS = []


def tree(files):
    root = pathlib.Path(tempfile.mkdtemp(prefix="mpx-tree-"))
    ROOTS.append(root)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run(root, check):
    r = subprocess.run([sys.executable, str(CHECKER), str(root), check], capture_output=True, text=True)
    return r.returncode, r.stdout


GOOD = {
    "include/mpx/errors.hpp": "#pragma once\n",
    "include/mpx/torch/blas.hpp": "#include <mpx/errors.hpp>\n",
    "include/mpx/torch/tensor.hpp": "#include <ATen/Tensor.h>\nat::Tensor t;\n",
    "include/mpx/torch/shaped.hpp": "#include <mpx/torch/tensor.hpp>\n// torch:: in a comment\nat::Tensor u;\n",
    "include/mpx/runtime/launch/env.hpp": "#include <mpx/errors.hpp>\nstd::getenv(\"RANK\");\n",
    "tests/errors.test.cpp": 'TEST_CASE("errors, and more", "[x]") {}\n',
    "tests/torch/blas.test.cpp": "",
    "tests/torch/tensor.test.cpp": "",
    "tests/torch/shaped.test.cpp": "",
    "tests/runtime/launch/env.test.cpp": "",
}
BAD = {  # check: (file, text, what the failure must name)
    "layers": ("include/mpx/torch/blas.hpp", "#include <mpx/runtime/launch/env.hpp>\n", "a higher layer"),
    "tests": ("tests/errors.test.cpp", 'TEST_CASE("errors; and more", "[x]") {}\n', "';'"),
    "lines": ("include/mpx/runtime/launch/env.hpp", "//\n" * 301, "over 300"),
    "environment": ("include/mpx/torch/blas.hpp", "int a = std::getenv(\"X\") != nullptr;\n", "reads the environment"),
    "torch": ("include/mpx/torch/blas.hpp", "#include <mpx/errors.hpp>\ntorch::Tensor blas;\n", "includes no LibTorch header"),
}

failures = []
for check, (rel, text, says) in BAD.items():
    code, out = run(tree(GOOD), check)
    if code != 0:
        failures.append(f"{check}: a tree that keeps the rule failed:\n{out}")
    code, out = run(tree({**GOOD, rel: text}), check)
    if code != 1 or rel not in out or says not in out:
        failures.append(f"{check}: a tree that breaks the rule in {rel} gave exit {code}:\n{out}")
code, out = run(tree({k: v for k, v in GOOD.items() if k != "tests/torch/blas.test.cpp"}), "tests")
if code != 1 or "include/mpx/torch/blas.hpp: no test" not in out:
    failures.append(f"tests: a header without a test gave exit {code}:\n{out}")
for root in ROOTS:
    shutil.rmtree(root, ignore_errors=True)
for f in failures:
    print(f)
print("check_tree self-test:", "ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
