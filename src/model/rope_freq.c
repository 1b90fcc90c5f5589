/* model/rope_freq.c — rotary inverse frequencies after rope_scaling, matching transformers' float32 math. */
#include <math.h>

#include "model/config.h"

/* Rounds to float32. transformers computes these tables with float32 tensor
 * ops; each op below is done in double on float operands and rounded, which
 * reproduces the float32 result exactly (double holds the exact product of
 * two floats, so contraction into FMA cannot change it either). */
static float f32(double x)
{
    return (float)x;
}

/* inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)). The
 * exponent is a float32 quotient, and base ** is a float32 pow: both are
 * rounded here as there, since the exponent's rounding alone moves the
 * result by several ulps for large theta. */
static void rope_default(float theta, int dim, float *inv_freq)
{
    for (int i = 0; i < dim / 2; i++) {
        float e = f32((double)(float)(2 * i) / (double)(float)dim);
        float p = f32(pow((double)theta, (double)e));
        inv_freq[i] = f32(1.0 / (double)p);
    }
}

/* transformers' _compute_longrope_parameters: 1.0 / (ext_factors * base ** e),
 * each op a float32 one. */
static void rope_longrope(const struct model_config *c, const float *factors, float *inv_freq)
{
    int dim = model_rope_dim(c);
    for (int i = 0; i < dim / 2; i++) {
        float e = f32((double)(float)(2 * i) / (double)(float)dim);
        float p = f32(pow((double)c->rope_theta, (double)e));
        inv_freq[i] = f32(1.0 / (double)f32((double)factors[i] * p));
    }
}

int model_rope_dim(const struct model_config *cfg)
{
    return cfg->rope_dim > 0 ? cfg->rope_dim : cfg->head_dim;
}

void model_rope_inv_freq_long(const struct model_config *cfg, float *inv_freq)
{
    rope_longrope(cfg, cfg->rope_long_factor, inv_freq);
}

void model_rope_inv_freq_local(const struct model_config *cfg, float *inv_freq)
{
    rope_default(cfg->rope_local_theta, model_rope_dim(cfg), inv_freq);
}

/* transformers' _compute_llama3_parameters, op for op. */
static void rope_llama3(const struct model_config *c, float *inv_freq)
{
    const double pi = 3.141592653589793;
    float factor = c->rope_factor;
    float low = c->rope_low_freq_factor, high = c->rope_high_freq_factor;
    float old_ctx = (float)c->rope_original_max_position;
    float low_freq_wavelen = f32((double)c->rope_original_max_position / (double)low);
    float high_freq_wavelen = f32((double)c->rope_original_max_position / (double)high);
    float band = f32((double)high - (double)low);
    float two_pi = f32(2.0 * pi);
    for (int i = 0; i < model_rope_dim(c) / 2; i++) {
        float f = inv_freq[i];
        float wavelen = f32((double)two_pi / f);
        float scaled = wavelen > low_freq_wavelen ? f32((double)f / factor) : f;
        float smooth = f32(f32(f32((double)old_ctx / wavelen) - (double)low) / (double)band);
        float kept = f32((double)f32(1.0 - (double)smooth) * scaled);
        float smoothed =
            f32((double)f32((double)kept / factor) + (double)f32((double)smooth * scaled));
        bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        inv_freq[i] = medium ? smoothed : scaled;
    }
}

void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq)
{
    if (cfg->rope_scaling == ROPE_SCALING_LONGROPE) {
        rope_longrope(cfg, cfg->rope_short_factor, inv_freq);
        return;
    }
    rope_default(cfg->rope_theta, model_rope_dim(cfg), inv_freq);
    if (cfg->rope_scaling == ROPE_SCALING_LINEAR) {
        for (int i = 0; i < model_rope_dim(cfg) / 2; i++)
            inv_freq[i] = f32((double)inv_freq[i] / cfg->rope_factor);
    } else if (cfg->rope_scaling == ROPE_SCALING_LLAMA3) {
        rope_llama3(cfg, inv_freq);
    }
}
