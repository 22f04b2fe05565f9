import sys, runpy
from hetflow.devices.cpu.kernels import own_gemm
own_gemm.LANES_MIN_DEPTH = int(sys.argv.pop(1))
sys.argv[0] = "benchmarks/replay_timeline.py"
runpy.run_path("benchmarks/replay_timeline.py", run_name="__main__")
