// Softmax of x viewed as [outer, cols, inner] along its middle axis, one work-item per (outer, inner)
// row: the row's maximum is subtracted before exp (no overflow), the exponentials are stored and then
// scaled by 1 / sum. inner = 1 is the last axis (contiguous rows). With -DLOG=1, LogSoftmax:
// y = x - max - log(sum of exp). Global size (rows = outer * inner).

#ifndef LOG
#define LOG 0
#endif

__kernel void softmax(const int rows, const int cols, const int inner, __global const float* restrict x,
                      __global float* restrict y)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    const long start = (long)(r / inner) * cols * inner + r % inner;
    x += start;
    y += start;
    float peak = -INFINITY;
    for (int j = 0; j < cols; ++j)
        peak = fmax(peak, x[(long)j * inner]);
    float total = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float e = exp(x[(long)j * inner] - peak);
#if !LOG
        y[(long)j * inner] = e;
#endif
        total += e;
    }
#if LOG
    const float shift = peak + log(total);
    for (int j = 0; j < cols; ++j)
        y[(long)j * inner] = x[(long)j * inner] - shift;
#else
    const float scale = 1.0f / total;
    for (int j = 0; j < cols; ++j)
        y[(long)j * inner] *= scale;
#endif
}
