#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the shape of mpx's header tree (docs/00_quickstart.md, "The tree"). Usage:

    check_tree.py <repository root> layers|tests|lines|environment|torch

layers       no header includes a header of a higher layer (the order below)
tests        every header has a same-named test (tests/<path>.test.cpp), or tests/README.md says why not;
             no test case's name has a ';' (CTest would split it in two)
lines        no header of the runtime is over 300 lines
environment  only the environment room (runtime/launch/env.hpp) reads the process environment
torch        a header that names torch::, at::, c10:: or c10d:: includes LibTorch, itself or through the mpx
             headers it includes (the header checks compile such headers after a precompiled <torch/torch.h>,
             which would hide the missing include)

Each failure is printed as `path: what is wrong; the fix`, and the check exits 1.
"""
import pathlib
import re
import sys

# The layers, lowest first: a header may include headers of its own layer and of the layers below it.
# A path matches the first pattern that matches it (patterns are relative to include/).
LAYERS = [
    ("ground", [r"mpx/(config|linkage|errors)\.hpp"]),
    ("core", [r"mpx/(?!tp\.hpp)[a-z_]+\.hpp"]),  # the compile-time layer (but the umbrellas, below)
    ("torch", [r"mpx/torch/.*"]),
    ("blocks", [r"mpx/(io|optim|tp|lora|quant)/.*", r"mpx/tp\.hpp"]),
    ("runtime/wire", [r"mpx/runtime/wire/.*"]),
    ("runtime/launch", [r"mpx/runtime/launch/.*"]),
    ("runtime/world", [r"mpx/runtime/world/.*"]),
    ("runtime/checkpoint", [r"mpx/runtime/checkpoint/.*"]),
    ("runtime", [r"mpx/runtime/[a-z_]+\.hpp"]),
    ("umbrellas", [r"mpx/(mpx|runtime)\.hpp"]),
]
UMBRELLAS = {"mpx/mpx.hpp", "mpx/runtime.hpp"}
MAX_RUNTIME_LINES = 300
ENVIRONMENT_ROOM = "mpx/runtime/launch/env.hpp"


def layer_of(rel):
    if rel in UMBRELLAS:
        return len(LAYERS) - 1
    for i, (_, patterns) in enumerate(LAYERS[:-1]):
        if any(re.fullmatch(p, rel) for p in patterns):
            return i
    return None


def headers(root):
    base = root / "include"
    return sorted(p.relative_to(base).as_posix() for p in (base / "mpx").rglob("*.hpp"))


def check_layers(root):
    errors = []
    include = re.compile(r'^\s*#\s*include\s*<(mpx/[^>]+)>', re.M)
    for rel in headers(root):
        mine = layer_of(rel)
        if mine is None:
            errors.append(f"include/{rel}: in no layer; file it under one (tests/tree/check_tree.py LAYERS, docs/00_quickstart.md)")
            continue
        text = (root / "include" / rel).read_text()
        for target in include.findall(text):
            theirs = layer_of(target)
            if theirs is None:
                errors.append(f"include/{rel}: includes <{target}>, which is in no layer (or does not exist)")
            elif theirs > mine:
                errors.append(f"include/{rel} (layer {LAYERS[mine][0]}) includes <{target}> (layer {LAYERS[theirs][0]}), "
                              "a higher layer; move what it needs down, or this header up")
    return errors


def readme_exempt(root):
    """The headers tests/README.md names in its table of headers without a test of their own."""
    readme = root / "tests" / "README.md"
    if not readme.exists():
        return set()
    return set(re.findall(r"^\|\s*`(mpx/[^`]+\.hpp)`", readme.read_text(), re.M))


def check_tests(root):
    errors = []
    exempt = readme_exempt(root)
    for rel in headers(root):
        test = root / "tests" / (rel[len("mpx/"):-len(".hpp")] + ".test.cpp")
        if test.exists():
            if rel in exempt:
                errors.append(f"tests/README.md: lists `{rel}` as without a test, but {test.relative_to(root)} exists; remove the line")
        elif rel not in exempt:
            errors.append(f"include/{rel}: no test {test.relative_to(root)}; write it, or say why not in tests/README.md")
    for rel in sorted(exempt - set(headers(root))):
        errors.append(f"tests/README.md: names `{rel}`, which is not a header; remove the line")
    return errors + check_test_names(root)


def check_test_names(root):
    """A test case's name must survive CTest: catch_discover_tests makes a list of the names, and CMake
    splits a list at ';', so a name with one becomes two tests that each find nothing and fail."""
    errors = []
    case = re.compile(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"')
    for path in sorted(list((root / "tests").rglob("*.cpp")) + list((root / "examples").rglob("*.cpp"))):
        for name in case.findall(path.read_text(errors="replace")):
            if ";" in name:
                errors.append(f"{path.relative_to(root)}: the test \"{name[:60]}...\" has a ';', which CTest splits "
                              "into two tests; write ',' instead")
    return errors


def check_lines(root):
    errors = []
    for rel in headers(root):
        if not rel.startswith("mpx/runtime/"):
            continue
        n = len((root / "include" / rel).read_text().splitlines())
        if n > MAX_RUNTIME_LINES:
            errors.append(f"include/{rel}: {n} lines, over {MAX_RUNTIME_LINES}; give one of its concepts a header of its own")
    return errors


def check_environment(root):
    errors = []
    reads = re.compile(r"getenv|\benviron\b")
    for rel in headers(root):
        if rel == ENVIRONMENT_ROOM:
            continue
        for n, line in enumerate((root / "include" / rel).read_text().splitlines(), 1):
            if reads.search(line):
                errors.append(f"include/{rel}:{n}: reads the environment; read it in {ENVIRONMENT_ROOM} (mpx::Env) and pass the value")
    return errors


def strip_comments(text):
    """The code of a header: comments and string literals removed (line breaks kept)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def check_torch(root):
    errors = []
    mpx_include = re.compile(r'^\s*#\s*include\s*<(mpx/[^>]+)>', re.M)
    torch_include = re.compile(r'^\s*#\s*include\s*<(torch|ATen|c10)/', re.M)
    names = re.compile(r"\b(torch|at|c10|c10d)::")
    texts = {rel: strip_comments((root / "include" / rel).read_text()) for rel in headers(root)}
    reaches = {}

    def reaches_torch(rel, seen=()):
        if rel not in reaches:
            text = texts.get(rel, "")
            reaches[rel] = bool(torch_include.search(text)) or any(
                reaches_torch(t, seen + (rel,)) for t in mpx_include.findall(text) if t not in seen)
        return reaches[rel]

    for rel, text in texts.items():
        m = names.search(text)
        if m and not reaches_torch(rel):
            line = text[:m.start()].count("\n") + 1
            errors.append(f"include/{rel}:{line}: names {m.group(0)} but includes no LibTorch header; include the one it uses")
    return errors


CHECKS = {"layers": check_layers, "tests": check_tests, "lines": check_lines, "environment": check_environment, "torch": check_torch}


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in CHECKS:
        print(__doc__)
        return 2
    errors = CHECKS[sys.argv[2]](pathlib.Path(sys.argv[1]))
    for e in errors:
        print(e)
    print(f"check_tree {sys.argv[2]}: {'ok' if not errors else str(len(errors)) + ' problem(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
