#!/usr/bin/env python3
"""docs/ARCHITECTURE.md against the code: its dependency graph is CMake's, it names every public
header, and every source file and path it names exists. Usage: architecture.py <project root>"""
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(sys.argv[1])
doc = (root / "docs/ARCHITECTURE.md").read_text()
problems = []

# 1. The graph in the first code block: "lib -> dep, dep (comment)" per line; internal deps only.
LIBS = ["cli", "planner", "interop", "loop", "traces", "exec", "sim", "sim_cost", "models", "spec"]
block = doc.split("```")[1]
documented = {}
for line in block.strip().splitlines():
    name, _, deps = line.partition("->")
    words = re.findall(r"[a-z_]+", re.sub(r"\([^)]*\)", "", deps))
    documented[name.strip()] = {w for w in words if w in LIBS}

# CMake: what each library (and the cli executable) links, by its folder's targets.
def cmake_deps(folder, own):
    text = (root / folder / "CMakeLists.txt").read_text()
    deps = set()
    for args in re.findall(r"target_link_libraries\(([^)]*)\)", text):
        target = args.split()[0]
        if target not in own:
            continue
        for lib in re.findall(r"sextant(?:::|_)([a-z_]+)", " ".join(args.split()[1:])):
            lib = "exec" if lib.startswith("exec") else lib
            if lib in LIBS:
                deps.add(lib)
    return deps

targets = {
    "cli": ("cli", {"sextant"}),
    "planner": ("planner", {"sextant_planner"}),
    "interop": ("interop", {"sextant_interop"}),
    "loop": ("loop", {"sextant_loop"}),
    "traces": ("traces", {"sextant_traces"}),
    "exec": ("exec", {"sextant_exec", "sextant_exec_manifest"}),
    "sim": ("sim", {"sextant_sim"}),
    "sim_cost": ("sim", {"sextant_sim_cost"}),
    "models": ("models", {"sextant_models"}),
    "spec": ("spec", {"sextant_spec"}),
}
for lib, (folder, own) in targets.items():
    linked = cmake_deps(folder, own) - {lib}
    if documented.get(lib) != linked:
        problems.append(f"graph: {lib} -> {sorted(documented.get(lib, []))} in the doc, "
                        f"{sorted(linked)} in {folder}/CMakeLists.txt")

# 2. Every public header is named (by its file name, in backticks).
named = set(re.findall(r"`([^`\s]+)`", doc))
names = {pathlib.PurePosixPath(n).name for n in named}
# The tracked files; where git cannot answer (no checkout, or a repository owned by another user),
# the files on disk outside build and output directories.
git = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True)
if git.returncode == 0 and git.stdout.strip():
    files = git.stdout.split()
else:
    skip = {".git", "build", "out"}
    files = [str(p.relative_to(root)) for p in root.rglob("*")
             if p.is_file() and not skip.intersection(p.relative_to(root).parts[:1])]
for f in files:
    if re.match(r"[a-z]+(/cost)?/include/sextant/[a-z_]+/[^/]+\.hpp$", f):
        if pathlib.PurePosixPath(f).name not in names:
            problems.append(f"files: {f} is not in docs/ARCHITECTURE.md")

# 3. Every source or header file the doc names exists (a pattern's files too).
basenames = {pathlib.PurePosixPath(f).name for f in files}
for n in sorted(named):
    if not re.search(r"\.(hpp|cpp|cu|h)$", n):
        continue
    name = pathlib.PurePosixPath(n).name
    # (`*` and `<...>` stand for any part of a name.)
    pattern = re.compile("^" + re.sub(r"<[^>]*>", ".*", re.escape(name).replace(r"\*", ".*"))
                         + "$")
    if not any(pattern.match(b) for b in basenames):
        problems.append(f"files: docs/ARCHITECTURE.md names {n}, which no file is")

# 4. A name with a folder in it (`src/gpt/`, `src/cuda/flash_mma.cuh`) is where the file or
# folder is: a tracked path ends with it (a folder's name: a tracked path holds it). Names with
# capitals are placeholders or identifiers, not paths.
for n in sorted(named):
    if "/" not in n or n.startswith(("http", "/", "$")) or not re.fullmatch(r"[a-z0-9_./*<>-]+", n):
        continue
    body = re.sub(r"<[^>]*>", ".*", re.escape(n).replace(r"\*", "[^/]*"))
    folder = n.endswith("/") or "." not in n.rsplit("/", 1)[-1]
    pattern = re.compile(r"(^|/)" + body + (r"(/|$)" if folder and not n.endswith("/") else
                                            "" if folder else "$"))
    if not any(pattern.search(f) for f in files):
        problems.append(f"paths: docs/ARCHITECTURE.md names {n}, which no tracked path is")

# 5. A row is a line a reader scans: what the file is for, not how it works (that is the
# header's comment).
for i, line in enumerate(doc.splitlines(), 1):
    if line.startswith("|") and len(line) > 400:
        problems.append(f"rows: docs/ARCHITECTURE.md:{i} runs to {len(line)} characters (> 400)")

for p in problems:
    print(p)
if problems:
    sys.exit(1)
print(f"docs/ARCHITECTURE.md: graph of {len(documented)} libraries and the files it names match")
