import time, numpy as np
from hetflow.devices.cpu.kernels import jit_winograd_lanes as wl
from hetflow.devices.cpu.kernels import winograd as wg
from hetflow.devices.cpu.kernels.jit_winograd import input_transform, output_transform, coefficients
rng = np.random.default_rng(0)
for m in (2, 4):
    t = wg.transforms(m)
    assert np.allclose(t.bt, wl.INPUT_MATRICES[m]) and np.allclose(t.at, wl.OUTPUT_MATRICES[m])
for (n, c, h, w, k, m, pad) in [(1, 64, 16, 16, 64, 4, 1), (2, 5, 7, 9, 3, 2, 1), (1, 32, 32, 32, 32, 4, 1), (3, 4, 13, 11, 6, 4, 0)]:
    a = m + 2
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    oh, ow = h + 2 * pad - 2, w + 2 * pad - 2
    tiles = (-(-oh // m), -(-ow // m))
    T = n * tiles[0] * tiles[1]
    bt = coefficients(wg.transforms(m).bt, np.float32)
    ref = np.zeros((a * a, c, T), np.float32)
    input_transform(x, bt, m, (pad, pad), tiles, ref)
    table = wl.tile_table(n, tiles, m, (-pad, -pad), w, c * h * w)
    v = np.full((a * a, c, T), np.nan, np.float32)
    wl.input_channels(x.reshape(-1), table.offsets, table.rows, table.cols, T, h, w, v.reshape(-1), 0, c, m)
    print('input', (n, c, h, w, m), np.abs(v - ref).max())
    prods = rng.standard_normal((a * a, k, T)).astype(np.float32)
    bias = rng.standard_normal(k).astype(np.float32)
    yref = np.zeros((n, k, oh, ow), np.float32)
    at = coefficients(wg.transforms(m).at, np.float32)
    output_transform(prods, at, bias, yref, tiles, None)
    y = np.full((n, k, oh, ow), np.nan, np.float32)
    otable = wl.tile_table(n, tiles, m, (0, 0), ow, k * oh * ow)
    act = np.array([1, -np.inf, np.inf], np.float32)
    wl.output_kernels(prods.reshape(-1), otable.offsets, otable.rows, otable.cols, T, oh, ow, y.reshape(-1), bias, act, 0, k, m)
    print('output', np.abs(y - yref).max())
    # timing one core
    for name, f in [('input old', lambda: input_transform(x, bt, m, (pad, pad), tiles, ref)),
                    ('input lanes', lambda: wl.input_channels(x.reshape(-1), table.offsets, table.rows, table.cols, T, h, w, v.reshape(-1), 0, c, m)),
                    ('output old', lambda: output_transform(prods, at, bias, yref, tiles, None)),
                    ('output lanes', lambda: wl.output_kernels(prods.reshape(-1), otable.offsets, otable.rows, otable.cols, T, oh, ow, y.reshape(-1), bias, act, 0, k, m))]:
        ts = []
        for i in range(300):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        print(f'   {name:14s} min {min(ts)*1e6:7.1f} us')
