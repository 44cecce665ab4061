#!/usr/bin/env bash
# The CPU's per-level kernels (kernels/cpu/gemm_kernel.cpp, softmax_ce_kernel.cpp) are only
# as fast as GCC's vectoriser makes them, and nothing else would notice when a loop stops
# vectorising (the cross-entropy's exponential ran one at a time at levels 2 and 3 until
# the fifty-first session: BENCHMARKS.md). Each loop marked `// [vectorised]` must be
# reported "loop vectorized" by -fopt-info-vec at every level, compiled with the build's
# own commands (compile_commands.json). Skipped (exit 77) for a compiler other than GCC
# and in a sanitizer build.
#   tests/scripts/cpu_vectorised.sh BUILD_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: cpu_vectorised.sh BUILD_DIR}
python3 - "$build" <<'PY'
import json, re, shlex, subprocess, sys
build = sys.argv[1]
cmds = [c for c in json.load(open(f"{build}/compile_commands.json"))
        if re.search(r"kernels/cpu/(gemm|softmax_ce)_kernel\.cpp$", c["file"])]
if not cmds:
    sys.exit("FAIL: no per-level kernel in compile_commands.json")
compiler = shlex.split(cmds[0]["command"])[0]
version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
if "Free Software Foundation" not in version:
    print(f"SKIP: {compiler} is not GCC (-fopt-info is GCC's)")
    sys.exit(77)  # ctest's SKIP_RETURN_CODE
if "-fsanitize" in cmds[0]["command"]:
    print("SKIP: a sanitizer build (instrumented loops do not vectorise)")
    sys.exit(77)
failures = checked = 0
for c in cmds:
    args = shlex.split(c["command"])
    args[args.index("-o") + 1] = "/dev/null"
    r = subprocess.run(args + ["-fopt-info-vec-optimized"], cwd=c["directory"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: compiling {c['file']}:\n{r.stderr}")
    level = re.search(r"-march=x86-64-v(\d)", c["command"]).group(1)
    vectorised = {int(m.group(1)) for m in re.finditer(r":(\d+):\d+: optimized: loop vectorized", r.stderr)}
    for n, line in enumerate(open(c["file"]), 1):
        code, _, comment = line.partition("//")
        if not code.strip() or comment.strip() != "[vectorised]":
            continue
        checked += 1
        name = c["file"].split("/")[-1]
        if n in vectorised:
            print(f"ok    level {level} {name}:{n}")
        else:
            failures += 1
            print(f"FAIL  level {level} {name}:{n} is not vectorised:  {line.strip()}")
if checked < 15:
    sys.exit(f"FAIL: only {checked} marked loops checked (expected 5 marks × 3 levels)")
sys.exit(1 if failures else 0)
PY
