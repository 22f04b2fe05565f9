// Data movement: Concat by writing each input into its slice of the output, and Transpose.

// Copy src, viewed as [outer, inner_src], into dst viewed as [outer, inner_dst] at column offset
// `offset`: Concat along an axis is one such copy per input into the same output buffer (inner = the
// input's extent along the axis times everything after it). Global size (inner_src, outer).
__kernel void copy_slice(__global const float* restrict src, __global float* restrict dst,
                         const int inner_src, const long inner_dst, const long offset)
{
    const int i = get_global_id(0);
    const int o = get_global_id(1);
    if (i >= inner_src)
        return;
    dst[o * inner_dst + offset + i] = src[(long)o * inner_src + i];
}

#define MAX_RANK 8

// Transpose: output element gid has coordinates over the output shape (meta[0 .. rank)); the input
// offset is their dot product with the input strides of the permuted axes (meta[MAX_RANK ..)).
__kernel void transpose(const int n, const int rank, __global const float* restrict x,
                        __global float* restrict y, __global const long* restrict meta)
{
    const int gid = get_global_id(0);
    if (gid >= n)
        return;
    long rem = gid, offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
        const long coord = rem % meta[d];
        rem /= meta[d];
        offset += coord * meta[MAX_RANK + d];
    }
    y[gid] = x[offset];
}
