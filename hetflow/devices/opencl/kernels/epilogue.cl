// The epilogue shared by producing kernels (convolutions, pooling-free layers): the activation fused
// into the producer by passes/fuse_activation.py, chosen at build time with -DACT (the same codes as
// gemm.cl): 0 none, 1 Relu, 2 LeakyRelu(act_a), 3 Clip(act_a, act_b), 4 Sigmoid, 5 Tanh.

#ifndef ACT
#define ACT 0
#endif

inline float activate(float x, float act_a, float act_b) {
#if ACT == 1
    return fmax(x, 0.0f);
#elif ACT == 2
    return x < 0.0f ? x * act_a : x;
#elif ACT == 3
    return fmin(fmax(x, act_a), act_b);
#elif ACT == 4
    return 1.0f / (1.0f + exp(-x));
#elif ACT == 5
    return tanh(x);
#else
    return x;
#endif
}
