// Softmax over the last axis of a [rows, cols] matrix, one work-item per row: the row's maximum is
// subtracted before exp (no overflow), the exponentials are stored and then scaled by 1 / sum.

__kernel void softmax(const int rows, const int cols, __global const float* restrict x,
                      __global float* restrict y)
{
    const int r = get_global_id(0);
    if (r >= rows)
        return;
    x += (long)r * cols;
    y += (long)r * cols;
    float peak = -INFINITY;
    for (int j = 0; j < cols; ++j)
        peak = fmax(peak, x[j]);
    float total = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float e = exp(x[j] - peak);
        y[j] = e;
        total += e;
    }
    const float scale = 1.0f / total;
    for (int j = 0; j < cols; ++j)
        y[j] *= scale;
}
