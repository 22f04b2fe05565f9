// LSTM time steps. xw [seq * batch, 4H] = X @ W^T + Wb + Rb holds every step's input projection (one GEMM
// before the loop). Gates are stacked i, o, f, c (ONNX's order); peepholes P = [P_i, P_o, P_f]; clip
// bounds every pre-activation; the activations are ONNX's defaults (Sigmoid, Tanh, Tanh). The new cell
// state overwrites c in place (one work-item owns each element); the new hidden state goes to Y (at its
// step and direction), to h_out (the final Y_h) and to h_next, the state the next step reads. With
// sequence lengths, steps past an element's length carry its state over, and the reverse direction runs
// backward within each element's own length (as the CPU kernel and ONNX Runtime do).
//
// lstm_cell runs after the recurrent GEMM gates [batch, 4H] = H_prev @ R^T (the tiled GEMM), with h_prev /
// h_next in the GEMM's A-panel layout (padding entries are never written: they stay zero). Global size
// (H, batch).

inline float sigmoid(const float x) { return 1.0f / (1.0f + exp(-x)); }

inline float bound(const float x, const int has_clip, const float clip) {
    return has_clip ? fmin(fmax(x, -clip), clip) : x;
}

// Step `step`'s time index for an element of length `length`, or -1 past its length.
inline int step_time(const int step, const int length, const int reverse) {
    if (step >= length)
        return -1;
    return reverse ? length - 1 - step : step;
}

// The cell update of unit j from its four gate pre-activations (recurrent + input parts): writes the new
// cell state over *c and returns the new hidden state.
inline float cell_update(float pi, float po, float pf, const float pc, __global float* c,
                         __global const float* restrict peep, const int has_peep, const int H, const int j,
                         const int has_clip, const float clip, const int input_forget)
{
    const float c_prev = *c;
    if (has_peep) {
        pi += peep[j] * c_prev;
        pf += peep[2 * H + j] * c_prev;
    }
    const float i = sigmoid(bound(pi, has_clip, clip));
    const float f = input_forget ? 1.0f - i : sigmoid(bound(pf, has_clip, clip));
    const float c_new = f * c_prev + i * tanh(bound(pc, has_clip, clip));
    if (has_peep)
        po += peep[H + j] * c_new;
    const float o = sigmoid(bound(po, has_clip, clip));
    *c = c_new;
    return o * tanh(c_new);
}

__kernel void lstm_cell(__global const float* restrict gates, __global const float* restrict xw,
                        __global float* restrict c, __global const float* restrict h_prev,
                        __global float* restrict h_next, const int a_width, const int kp,
                        __global float* restrict y, __global float* restrict h_out,
                        __global const float* restrict peep, const int has_peep,
                        const int H, const int has_clip, const float clip, const int input_forget,
                        __global const int* restrict lengths, const int has_lengths,
                        const int step, const int seq, const int batch, const int reverse,
                        const int dirs, const int d)
{
    const int j = get_global_id(0);
    const int b = get_global_id(1);
    if (j >= H)
        return;
    const long panel = ((long)(b / a_width) * kp + j) * a_width + b % a_width;
    const int t = step_time(step, has_lengths ? lengths[b] : seq, reverse);
    if (t < 0) {
        h_next[panel] = h_prev[panel];  // past this element's length (Y stays zero there)
        return;
    }
    const long row = (long)b * 4 * H;
    __global const float* x = xw + ((long)t * batch) * 4 * H + row;
    const float h = cell_update(gates[row + j] + x[j], gates[row + H + j] + x[H + j],
                                gates[row + 2 * H + j] + x[2 * H + j], gates[row + 3 * H + j] + x[3 * H + j],
                                c + b * H + j, peep, has_peep, H, j, has_clip, clip, input_forget);
    h_out[b * H + j] = h;
    y[(((long)t * dirs + d) * batch + b) * H + j] = h;
    h_next[panel] = h;
}
