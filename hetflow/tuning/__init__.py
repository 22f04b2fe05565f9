"""Per-layer algorithm choice: what can be chosen (space), how it is timed (measure), where timings are
kept (cache), and the one place that decides "measured, else cost model" (select)."""

from hetflow.tuning.cache import TuningCache, TuningRecord
from hetflow.tuning.select import Tuner, choose_kernel
from hetflow.tuning.space import Workload, tunable_kernels, workload_of

__all__ = ["Tuner", "TuningCache", "TuningRecord", "Workload", "choose_kernel", "tunable_kernels", "workload_of"]
