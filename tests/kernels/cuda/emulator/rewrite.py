"""Turns one of ktune's .cu files into host C++ for the emulator (fake/cuda_runtime.h), changing only
what C++ cannot express:

  kernel<<<grid, block[, shared[, stream]]>>>(args);
      -> emu_launch(emu_config(kernel, grid, block[, shared[, stream]]),
                    [&] { ::emu::check_kernel_pointers(args); kernel(args); });
     (the check: every pointer argument null or into device or pinned memory, as a GPU needs; the
     arguments are evaluated twice, which ktune's launches, free of side effects, allow)
     (a template kernel launched with deduced arguments has no address to name: `nullptr` stands for
     it, and the emulator holds that launch to the default 48 KiB of dynamic shared memory)
  extern __shared__ [__align__(n)] T smem[];
      -> T* smem = reinterpret_cast<T*>(::emu::shared_memory());
  __shared__ T name[dims];                      (a statically sized array, at block scope)
      -> auto& name = ::emu::static_shared<T[dims]>(id);
  __global__ void __launch_bounds__(threads[, blocks]) kernel(params) {
      -> __global__ void kernel(params) { ::emu::check_launch_bounds(threads);
     (a launch with more threads a block than the bound fails on the device; `blocks`, a register
     budget, has no meaning here)

Everything else (kernels, index arithmetic, host code) is compiled as written. The output starts with
a #line naming the real source and keeps every line where it was, so compiler errors, __FILE__ and
__LINE__ point into src/. It fails (exit 1) when a `<<<` or a `__shared__` is left that it did not
understand, so a new construct in a kernel cannot slip past the emulator unrewritten.
It deliberately does not parse C++: the three patterns are regular expressions over the text.

usage: python3 rewrite.py SOURCE.cu OUTPUT.cpp
"""
import re
import sys


def strip_comments(text):
    """The text with // and /* */ comments blanked (to look for leftovers in code only)."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def same_lines(replacement, original):
    """replacement followed by as many newlines as original spans, so later lines keep their numbers."""
    return replacement + "\n" * original.count("\n")


def top_level_count(params):
    """The number of comma-separated items in a template parameter/argument list (0 when empty)."""
    depth, items = 0, 1 if params.strip() else 0
    for c in params:
        depth += c in "<(["
        depth -= c in ">)]"
        items += c == "," and depth == 0
    return items


def rewrite(src):
    counts = {"launch": 0, "extern_shared": 0, "static_shared": 0, "launch_bounds": 0}

    def launch_bounds(m):
        counts["launch_bounds"] += 1
        return f"{m.group(2)}{{ ::emu::check_launch_bounds({m.group(1).strip()});"

    src = re.sub(r"__launch_bounds__\(([^,()]+)(?:,[^()]*)?\)(\s*\w+\s*\([^{;]*\)\s*)\{", launch_bounds, src)

    def extern_shared(m):
        counts["extern_shared"] += 1
        t = m.group(1)
        return f"{t}* smem = reinterpret_cast<{t}*>(::emu::shared_memory());"

    src = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?(unsigned char|float) smem\[\];", extern_shared, src)

    def static_shared(m):
        counts["static_shared"] += 1
        t, name, dims = m.group(1), m.group(2), m.group(3)
        return f"auto& {name} = ::emu::static_shared<{t}{dims}>({counts['static_shared']});"

    src = re.sub(r"__shared__ ((?:unsigned |signed |long |short )*\w+) (\w+)((?:\[[^\]\n]+\])+);", static_shared, src)

    # Template kernels and how many template parameters each has: a launch that names fewer (the rest
    # deduced from the arguments) cannot take the kernel's address.
    template_kernels = {}
    for m in re.finditer(r"template\s*<([^;{]*?)>\s*((?:__global__|__launch_bounds__\([^)]*\)|static|inline|\s)+)"
                         r"void\s+(\w+)\s*\(", strip_comments(src)):
        if "__global__" in m.group(2):
            template_kernels[m.group(3)] = top_level_count(m.group(1))

    def launch(m):
        counts["launch"] += 1
        kernel, config, args = m.group(1), m.group(2), m.group(3)
        name, _, given = kernel.partition("<")
        needed = template_kernels.get(name.split("::")[-1], 0)
        key = kernel if top_level_count(given.rpartition(">")[0]) >= needed else "nullptr"
        text = f"emu_launch(emu_config({key}, {config}), [&] {{ ::emu::check_kernel_pointers({args}); {kernel}({args}); }});"
        return same_lines(re.sub(r"\s*\n\s*", " ", text), m.group(0))

    src = re.sub(r"([\w:]+(?:<[^<>;]*>)?)<<<(.*?)>>>\((.*?)\);", launch, src, flags=re.S)

    code = strip_comments(src)
    leftovers = [w for w in ("<<<", "__shared__", "__launch_bounds__") if w in code]
    return src, counts, leftovers


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, output = sys.argv[1], sys.argv[2]
    with open(source) as f:
        src = f.read()
    out, counts, leftovers = rewrite(src)
    if leftovers:
        sys.exit(f"rewrite.py: {source}: {', '.join(leftovers)} left that the emulator cannot rewrite")
    with open(output, "w") as f:
        f.write(f'#line 1 "{source}"\n' + out)
    print(f"rewrite.py: {source}: {counts['launch']} launches, {counts['extern_shared']} dynamic and "
          f"{counts['static_shared']} static shared arrays, {counts['launch_bounds']} launch bounds")


if __name__ == "__main__":
    main()
