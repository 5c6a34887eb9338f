/* LeRobot's running sums of an RGB frame's pixels in one pass (storage/rgb_sums.py says why this is C).
 *
 * Per channel: a float32 sum of the values and one of their squares, each taken pixel after pixel in row-major
 * order (the order of LeRobot's sequential float32 sum), and counts of the 256 values. Built without fast-math
 * and with contraction off (setup.py), so every addition rounds to float32 exactly as numpy's does.
 * Strides are in bytes and may be anything numpy allows (a strided view is read where it lies). */
#include <stddef.h>
#include <stdint.h>

void demoforge_add_rgb_pixels(const uint8_t *base, ptrdiff_t height, ptrdiff_t width, ptrdiff_t row_stride,
                              ptrdiff_t column_stride, ptrdiff_t channel_stride, float *total, float *total_sq,
                              int64_t *counts)
{
    float t0 = total[0], t1 = total[1], t2 = total[2];
    float s0 = total_sq[0], s1 = total_sq[1], s2 = total_sq[2];
    for (ptrdiff_t y = 0; y < height; y++) {
        const uint8_t *pixel = base + y * row_stride;
        for (ptrdiff_t x = 0; x < width; x++, pixel += column_stride) {
            const uint8_t r = pixel[0], g = pixel[channel_stride], b = pixel[2 * channel_stride];
            const float fr = (float)r, fg = (float)g, fb = (float)b;
            t0 += fr;
            t1 += fg;
            t2 += fb;
            s0 += fr * fr;
            s1 += fg * fg;
            s2 += fb * fb;
            counts[r] += 1;
            counts[256 + g] += 1;
            counts[512 + b] += 1;
        }
    }
    total[0] = t0, total[1] = t1, total[2] = t2;
    total_sq[0] = s0, total_sq[1] = s1, total_sq[2] = s2;
}
