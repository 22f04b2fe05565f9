// Elementwise kernels, generated from two templates by elementwise.py: one kernel per op, all in one
// program (one build). EXPR is the op's expression of x (and z for binary ops, p0/p1 for parameters).

#define MAX_RANK 8

// Binary op with numpy broadcasting: meta holds the output shape, then A's and B's element strides
// (0 along broadcast axes), MAX_RANK entries each. `same` = 1 when neither input broadcasts.
#define BINARY(NAME, EXPR)                                                                              \
__kernel void NAME(const int n, const int rank, const int same,                                       \
                   __global const float* restrict a, __global const float* restrict b,                \
                   __global float* restrict y, __global const int* restrict meta)                      \
{                                                                                                     \
    const int gid = get_global_id(0);                                                                 \
    if (gid >= n)                                                                                     \
        return;                                                                                       \
    int ia = gid, ib = gid;                                                                           \
    if (!same) {                                                                                      \
        ia = 0;                                                                                       \
        ib = 0;                                                                                       \
        int rem = gid;                                                                                \
        for (int d = rank - 1; d >= 0; --d) {                                                         \
            const int coord = rem % meta[d];                                                          \
            rem /= meta[d];                                                                           \
            ia += coord * meta[MAX_RANK + d];                                                         \
            ib += coord * meta[2 * MAX_RANK + d];                                                     \
        }                                                                                             \
    }                                                                                                 \
    const float x = a[ia];                                                                            \
    const float z = b[ib];                                                                            \
    y[gid] = (EXPR);                                                                                  \
}

#define UNARY(NAME, EXPR)                                                                               \
__kernel void NAME(const int n, __global const float* restrict a, __global float* restrict y,         \
                   const float p0, const float p1)                                                    \
{                                                                                                     \
    const int gid = get_global_id(0);                                                                 \
    if (gid >= n)                                                                                     \
        return;                                                                                       \
    const float x = a[gid];                                                                           \
    y[gid] = (EXPR);                                                                                  \
}
