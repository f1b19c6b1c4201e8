#!/usr/bin/env python3
"""The CUDA-only tree builds on a bare GPU machine: a check that runs here, without a GPU.

scripts/gpu-check.sh builds the CUDA backend's tests and benchmarks (-DKTUNE_CPU_ENGINE=OFF) on a
machine that has the CUDA toolkit, CMake, a C++ compiler and Python, but none of Debian's -dev
packages (issue 8). This machine has those packages, so a build here would not notice a header or a
library that only they provide. This script configures the same tree, takes the commands that
build gpu-check's three targets (`ninja -t commands`), and:
  - runs each compile command as a dependency listing (the compiler's -M: every header it reads),
    and attributes each header to what provides it: this source tree, the build tree, the CUDA
    toolkit, or (dpkg -S) a Debian package, of which only the compiler's and the C library's are
    allowed (gcc, g++, libstdc++, libgcc, libc, the kernel headers);
  - reads each link command's libraries the same way (CUDA's, the build tree's own archives, and
    the compiler's and C library's: libgomp, libpthread, libm, ...).
  - reads the Python scripts gpu-check.sh runs (bench/gpu/*_compare.py) for imports beyond the
    standard library and the GPU machine's PyTorch, transformers and PEFT.
Anything else is printed with the source that reads it, and the check fails (exit 1). Exit 77: it
cannot run here (no nvcc, ninja or dpkg), which the test harness reports as skipped.

  check_cuda_only_tree.py SOURCE_DIR WORK_DIR
"""
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys

TARGETS = ["ktune_cuda_kernels_tests", "ktune_gpu_gemm_bench", "ktune_gpu_train_step_bench"]
# The Python that scripts/gpu-check.sh runs there, and what the GPU machine's Python has besides its
# standard library (issue 8: PyTorch, transformers, PEFT).
GPU_CHECK_SCRIPT = "scripts/gpu-check.sh"
GPU_MACHINE_PACKAGES = {"torch", "transformers", "peft"}
# Debian packages a machine with a C++ compiler has: the compiler's own and the C library's.
ALLOWED_PACKAGES = re.compile(
    r"^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libstdc\+\+-\d+-dev|libstdc\+\+6|libgcc-\d+-dev|libgcc-s1|"
    r"gcc-\d+|g\+\+-\d+|cpp-\d+|libgomp1)(:[a-z0-9]+)?$")
# Libraries named with -l that the toolkit or the compiler and C library provide.
ALLOWED_LINK_NAMES = {"cudart", "cudart_static", "cudadevrt", "cublas", "cublasLt", "cuda", "culibos", "dl", "rt", "pthread",
                      "m", "gomp", "stdc++", "gcc_s", "gcc"}
SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".c", ".cu")


def skip(why):
    print(f"SKIP check_cuda_only_tree: {why}")
    sys.exit(77)


def run(cmd, cwd, what):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        print(f"FAIL {what}: exit {r.returncode}\n{r.stdout[-4000:]}{r.stderr[-4000:]}")
        sys.exit(1)
    return r.stdout


def cuda_root(nvcc):
    return os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(nvcc)), ".."))


def compile_source(argv):
    """The source file of a compile command (the argument after -c), or None (not a compile)."""
    if "-c" not in argv:
        return None
    i = argv.index("-c")
    if i + 1 < len(argv) and argv[i + 1].endswith(SOURCE_SUFFIXES):
        return argv[i + 1]
    return None


def dependency_command(argv):
    """A compile command turned into its compiler's dependency listing (-M to stdout): without the
    launcher (ccache), -c, its output and its own depfile options."""
    while argv and os.path.basename(argv[0]) in ("ccache", "sccache"):
        argv = argv[1:]
    out, skip_next = [], False
    for a in argv:
        if skip_next:
            skip_next = False
            continue
        if a in ("-o", "-MT", "-MF", "-MQ"):
            skip_next = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith(("-MF", "-MT")):
            continue
        out.append(a)
    return out + ["-M"]


def parse_make_deps(text):
    """The prerequisites of make-style rules (`obj: a.h b.h \\`)."""
    deps = []
    for rule in text.replace("\\\n", " ").splitlines():
        if ":" not in rule:
            continue
        _, _, rest = rule.partition(": ")
        if not rest and rule.endswith(":"):
            continue
        deps.extend(p.replace("\\ ", " ") for p in re.split(r"(?<!\\) +", rest.strip()) if p)
    return deps


def list_dependencies(build, argv):
    source = compile_source(argv)
    r = subprocess.run(dependency_command(argv), cwd=build, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        return source, None, r.stderr[-3000:]
    paths = [os.path.normpath(p if os.path.isabs(p) else os.path.join(build, p)) for p in parse_make_deps(r.stdout)]
    return source, paths, None


def packages_of(paths):
    """dpkg -S over the paths: {path: package} for those a package owns (others are left out). dpkg
    knows a file by the path its package installed, which a merged /usr may reach through a link, so
    each path's real path is asked in the same calls."""
    asked = sorted(set(paths) | {os.path.realpath(p) for p in paths})
    found = {}
    for i in range(0, len(asked), 200):
        r = subprocess.run(["dpkg", "-S"] + asked[i:i + 200], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
        for line in r.stdout.splitlines():
            pkgs, _, path = line.partition(": ")
            if path:
                found[path] = pkgs.split(",")[0].strip()
    owners = {}
    for p in paths:
        owner = found.get(p) or found.get(os.path.realpath(p))
        if owner:
            owners[p] = owner
    return owners


def python_scripts_of(source_dir):
    """The .py files scripts/gpu-check.sh runs (`python3 PATH`)."""
    text = open(os.path.join(source_dir, GPU_CHECK_SCRIPT)).read()
    return sorted(set(re.findall(r"python3\s+([\w./-]+\.py)", text)))


def foreign_imports(path):
    """The top-level modules a script imports (anywhere in it) that are neither the standard
    library's, the GPU machine's packages, nor a module beside the script: [(module, line)]."""
    import ast
    tree = ast.parse(open(path).read(), path)
    here = {os.path.splitext(f)[0] for f in os.listdir(os.path.dirname(path))}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in GPU_MACHINE_PACKAGES and top not in here:
                found.append((top, node.lineno))
    return found


def build_commands(build):
    """The compile and link commands (argv lists) that build TARGETS in the configured tree."""
    compiles, links = [], []
    for line in run(["ninja", "-t", "commands"] + TARGETS, build, "ninja -t commands").splitlines():
        for part in line.split(" && "):
            argv = shlex.split(part.strip().lstrip(":").strip()) if part.strip() not in (":", "") else []
            if not argv:
                continue
            if compile_source(argv):
                compiles.append(argv)
            elif "-o" in argv and os.path.basename(argv[argv.index("-o") + 1]) in TARGETS:
                links.append(argv)
    if not compiles or len(links) != len(TARGETS):
        print(f"FAIL: found {len(compiles)} compile and {len(links)} link commands for {', '.join(TARGETS)}")
        sys.exit(1)
    return compiles, links


def native_failures(source_dir, build, cuda, compiles, links):
    """What the compiles read and the links name from outside the trees that no allowed package owns."""
    inside = (source_dir + os.sep, build + os.sep, cuda + os.sep)

    def outside(path):
        return not path.startswith(inside) and not os.path.realpath(path).startswith(inside)

    readers = {}  # outside header -> the first source that reads it
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for source, paths, error in pool.map(lambda a: list_dependencies(build, a), compiles):
            if paths is None:
                failures.append(f"{source}: the dependency listing failed:\n{error}")
                continue
            for p in paths:
                if outside(p):
                    readers.setdefault(p, source)
    link_paths = {}  # outside library -> the target that links it
    for argv in links:
        target = os.path.basename(argv[argv.index("-o") + 1])
        for a in argv:
            if a.startswith("-l") and a[2:] not in ALLOWED_LINK_NAMES:
                failures.append(f"{target} links -l{a[2:]}, which neither CUDA nor the compiler provides")
            elif os.path.isabs(a) and re.search(r"\.(so(\.\d+)*|a)$", a) and outside(os.path.normpath(a)):
                link_paths.setdefault(os.path.normpath(a), target)
    owners = packages_of(list(readers) + list(link_paths))

    def refused_owner(path):  # its package (or "no package") when that is not an allowed one, else None
        pkg = owners.get(path)
        return None if pkg and ALLOWED_PACKAGES.match(pkg) else pkg or "no package"

    refused = {}  # package -> [(header, the first source that reads it)]
    for p, source in sorted(readers.items()):
        if refused_owner(p):
            refused.setdefault(refused_owner(p), []).append((p, os.path.relpath(source, source_dir)))
    for pkg, headers in sorted(refused.items()):
        sources = sorted({s for _, s in headers})
        failures.append(f"{len(headers)} header(s) of {pkg}, e.g. {headers[0][0]}, read by {', '.join(sources[:5])}"
                        + (f" and {len(sources) - 5} more" if len(sources) > 5 else ""))
    for p, target in sorted(link_paths.items()):
        if refused_owner(p):
            failures.append(f"{target} links {p} ({refused_owner(p)})")
    packages = sorted({owners[p] for p in list(readers) + list(link_paths) if p in owners})
    print(f"CUDA-only tree ({', '.join(TARGETS)}): {len(compiles)} sources, {len(readers)} headers and "
          f"{len(link_paths)} libraries from outside the source tree and the CUDA toolkit ({cuda}), "
          f"from the packages: {', '.join(packages) or 'none'}")
    return failures


def python_failures(source_dir):
    """The imports of gpu-check's Python scripts that the GPU machine's Python lacks."""
    failures = []
    scripts = python_scripts_of(source_dir)
    if not scripts:
        failures.append(f"found no `python3 SCRIPT.py` in {GPU_CHECK_SCRIPT}")
    for script in scripts:
        for module, line in foreign_imports(os.path.join(source_dir, script)):
            failures.append(f"{script}:{line} imports {module}, which the GPU machine's Python lacks "
                            f"(it has the standard library and {', '.join(sorted(GPU_MACHINE_PACKAGES))})")
    print(f"gpu-check's Python ({', '.join(scripts)}): imports checked against the standard library and "
          f"{', '.join(sorted(GPU_MACHINE_PACKAGES))}")
    return failures


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    source_dir, work = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if not nvcc:
        skip("no nvcc")
    if not shutil.which("ninja"):
        skip("no ninja")
    if not shutil.which("dpkg"):
        skip("no dpkg: the headers' packages cannot be told apart")
    build = os.path.join(work, "cuda-only")
    shutil.rmtree(build, ignore_errors=True)
    os.makedirs(build)
    r = subprocess.run(["cmake", "-S", source_dir, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        "-DKTUNE_CPU_ENGINE=OFF", "-DKTUNE_CUDA=ON", "-DKTUNE_CCACHE="],
                       env=dict(os.environ, CUDACXX=nvcc), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(f"FAIL configure of the CUDA-only tree (as scripts/gpu-check.sh does):\n{r.stdout[-4000:]}")
        sys.exit(1)
    compiles, links = build_commands(build)
    failures = native_failures(source_dir, build, cuda_root(nvcc), compiles, links) + python_failures(source_dir)
    if failures:
        print("FAIL: the bare GPU machine (the CUDA toolkit, a compiler, no -dev packages) lacks what these need:")
        for f in failures:
            print("  " + f)
        sys.exit(1)
    print("PASS: every header and library is the source tree's, the CUDA toolkit's, or the compiler's and C library's; "
          "every import the standard library's or the GPU machine's packages")


if __name__ == "__main__":
    main()
