// Normalisation on [N, C, P] float32 (P = product of the spatial sizes).

// LRN across channels: y = x / (bias + alpha / size * sum of x^2 over channels c - before .. c + after,
// clipped to [0, C)) ^ beta. One work-item per element. Global size (P, C, N).
__kernel void lrn(__global const float* restrict x, __global float* restrict y,
                  const int C, const int P, const int before, const int after,
                  const float alpha_over_size, const float bias, const float beta)
{
    const int p = get_global_id(0);
    const int c = get_global_id(1);
    const int n = get_global_id(2);
    if (p >= P)
        return;
    __global const float* xn = x + (long)n * C * P + p;
    const int lo = max(c - before, 0), hi = min(c + after, C - 1);
    float total = 0.0f;
    for (int i = lo; i <= hi; ++i) {
        const float v = xn[(long)i * P];
        total += v * v;
    }
    const float d = bias + alpha_over_size * total;
    y[((long)n * C + c) * P + p] = xn[(long)c * P] / pow(d, beta);
}

// BatchNormalization, inference form, with the statistics folded on the host into one factor and one
// shift per channel, stored as params = [factor[0..C), shift[0..C)]: y = x * factor[c] + shift[c],
// then the fused activation (epilogue.cl, chosen with -DACT). Global size (P, C, N).
__kernel void batchnorm(__global const float* restrict x, __global float* restrict y,
                        __global const float* restrict params, const int C, const int P,
                        const float act_a, const float act_b)
{
    const int p = get_global_id(0);
    const int c = get_global_id(1);
    const int n = get_global_id(2);
    if (p >= P)
        return;
    const long i = ((long)n * C + c) * P + p;
    y[i] = activate(x[i] * params[c] + params[C + c], act_a, act_b);
}
