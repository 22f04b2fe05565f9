"""CPU kernels, one module per op family (mirrors ``hetflow.ops``)."""

from hetflow.devices.cpu.kernels import (  # noqa: F401  (imported for their registrations)
    activation,
    conv,
    direct,
    elementwise,
    gemm,
    norm,
    pool,
    reduce,
    rnn,
    softmax,
    tensor,
    winograd,
)
