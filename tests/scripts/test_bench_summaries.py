"""The goal lines of scripts/bench_attention.py (issue 12: at or above cuDNN) and
scripts/bench_decode.py (issue 11: at or above the best SDPA backend), on made-up rows
whose counts are known. Runs under the stub torch (CTest BenchScriptGoalSummaries)."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import bench_attention  # noqa: E402
import bench_decode  # noqa: E402

# Attention: three shapes; column "a" is above cuDNN on the first, level on the second
# (equal counts as at or above) and under on the third going forward; backward only the
# second is measured against a cuDNN figure (cuDNN refused the others: None).
shapes = [{"B": 1, "H": 2, "T": T, "D": 64, "causal": c} for T, c in ((1024, True), (2048, False), (4096, True))]
keys = [(s["B"], s["H"], s["T"], s["D"], s["causal"]) for s in shapes]
runs = {"a": {keys[0]: {"fwd_tflops": 110.0, "bwd_tflops": 50.0}, keys[1]: {"fwd_tflops": 100.0, "bwd_tflops": 90.0},
              keys[2]: {"fwd_tflops": 95.0, "bwd_tflops": 70.0}},
        "b": {keys[0]: {"fwd_tflops": 90.0, "bwd_tflops": 50.0}}}
baselines = {keys[0]: ((80.0, 40.0), (100.0, None)), keys[1]: ((80.0, 40.0), (100.0, 100.0)),
             keys[2]: ((80.0, 40.0), (100.0, None))}
out = bench_attention.goal_summary(shapes, runs, ["a", "b"], baselines).splitlines()
print("\n".join(out))
assert out[0] == "a forward against cuDNN: at or above on 2 of 3, 0.950-1.100x; under: 1x2x4096 D64 causal 0.950", out[0]
assert out[1] == "a backward against cuDNN: at or above on 0 of 1, 0.900-0.900x; under: 1x2x2048 D64 full 0.900", out[1]
assert out[2] == "b forward against cuDNN: at or above on 0 of 1, 0.900-0.900x; under: 1x2x1024 D64 causal 0.900", out[2]
assert len(out) == 3, "column b's backward has no cuDNN figure: no line"

# Decode: SDPA's time / ours; a shape where no SDPA backend ran (nan) is left out.
rows = [{"B": 1, "H": 12, "D": 64, "T": T, "ms": ms} for T, ms in ((1024, 0.010), (2048, 0.020), (4096, 0.030), (8192, 0.040))]
line = bench_decode.goal_summary(rows, [0.015, 0.020, 0.0297, math.nan])
print(line)
assert line == "at or above the best SDPA backend on 2 of 3 shapes, 0.990-1.50x; under: B1 H12 D64 T4096 0.9900", line
assert bench_decode.goal_summary(rows[:1], [math.nan]) == "no SDPA backend ran"
print("ok")
