// Optimizer updates in place, one work-item per parameter element (launchers in optim.py). Each follows
// hetflow/train/optim.py's numpy update operation for operation, so float32 results agree with it to
// the rounding of a fused multiply-add at most. Scalars derived in double precision on the host (1 - beta,
// lr * weight_decay, Adam's bias-corrected step) arrive as float32, as numpy's do.

// SGD: g = grad + wd * p (when wd != 0); with momentum v = momentum * v + g and the step is v, or
// g + momentum * v (Nesterov); p -= lr * step.
__kernel void sgd_update(__global float* restrict param, __global const float* restrict grad,
                         __global float* restrict velocity, const float lr, const float momentum,
                         const float weight_decay, const int use_momentum, const int nesterov)
{
    const long i = get_global_id(0);
    const float p = param[i];
    float g = grad[i];
    if (weight_decay != 0.0f)
        g = g + weight_decay * p;
    float step = g;
    if (use_momentum) {
        const float v = velocity[i] * momentum + g;
        velocity[i] = v;
        step = nesterov ? g + momentum * v : v;
    }
    param[i] = p - lr * step;
}

// Adam / AdamW: g = grad + wd * p for the L2 form; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// the decoupled form first shrinks p by lr * wd; p -= step * m / (sqrt(v) + eps).
__kernel void adam_update(__global float* restrict param, __global const float* restrict grad,
                          __global float* restrict m, __global float* restrict v,
                          const float beta1, const float beta2, const float one_minus_beta1,
                          const float one_minus_beta2, const float step, const float eps,
                          const float weight_decay, const float decay, const int decoupled)
{
    const long i = get_global_id(0);
    float p = param[i];
    float g = grad[i];
    if (weight_decay != 0.0f && !decoupled)
        g = g + weight_decay * p;
    const float m1 = m[i] * beta1 + one_minus_beta1 * g;
    const float v1 = v[i] * beta2 + one_minus_beta2 * g * g;
    m[i] = m1;
    v[i] = v1;
    if (weight_decay != 0.0f && decoupled)
        p = p - decay * p;
    param[i] = p - step * m1 / (sqrt(v1) + eps);
}
