// The per-element optimizer arithmetic, written once for the CPU scalar path, the CPU SIMD paths
// and the CUDA kernels. V is float or a SIMD vector of floats providing +, -, *, /, unary -, a
// broadcasting constructor from float, and the free functions Sqrt, Max and Sign.
//
// Every operation is a correctly rounded IEEE operation applied in the order torch.optim applies
// it (docs/kernels.md), so every path computes the same bits when multiply-adds are not fused
// (-ffp-contract=off on the host, --fmad=false for nvcc).
#ifndef ZEROSHARD_KERNELS_UPDATE_MATH_H_
#define ZEROSHARD_KERNELS_UPDATE_MATH_H_

#include "numerics/host_device.h"

namespace zeroshard::kernels {

// The constants of one update of one piece. Hyperparameters are combined in double (as
// torch.optim does in Python) and rounded to float once, on the host (see MakeElementScalars).
struct ElementScalars {
  float grad_scale = 1.0f;           // multiplies every gradient element first
  float lr = 0.0f;                   // lr * lr_scale (SGD, Lion)
  float weight_decay = 0.0f;         // 0 when the piece has weight decay off
  float momentum = 0.0f;             // SGD
  float one_minus_dampening = 1.0f;  // SGD
  float beta1 = 0.0f;
  float one_minus_beta1 = 1.0f;
  float beta2 = 0.0f;
  float one_minus_beta2 = 1.0f;
  // Adam(W): -lr / (1 - beta1^step); Adagrad: -lr / (1 + (step - 1) * lr_decay).
  float neg_step_size = 0.0f;
  float bias_correction2_sqrt = 1.0f;  // Adam(W): sqrt(1 - beta2^step)
  float eps = 0.0f;
  float decay_factor = 1.0f;         // AdamW: 1 - lr * weight_decay
  float initial_accumulator = 0.0f;  // Adagrad
  bool first_step = false;           // state arrays are read as their initial values
  bool maximize = false;
  bool weight_decay_on = false;  // weight_decay != 0
  bool nesterov = false;
  bool amsgrad = false;
};

ZS_HOST_DEVICE inline float Sqrt(float x) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(x);
#else
  return __builtin_sqrtf(x);
#endif
}

// a > b ? a : b, the semantics of x86 MAXPS (the second operand wins ties and NaNs).
ZS_HOST_DEVICE inline float Max(float a, float b) { return a > b ? a : b; }

// 1, -1 or 0 (0 for +-0 and NaN).
ZS_HOST_DEVICE inline float Sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }

// The gradient as the optimizer sees it: scaled, and negated under `maximize`.
template <class V>
ZS_HOST_DEVICE inline V ScaledGradient(const ElementScalars& s, V grad) {
  V g = grad * V(s.grad_scale);
  return s.maximize ? -g : g;
}

// torch.optim.SGD. `buf` is the momentum buffer (unused when momentum is 0).
template <class V>
ZS_HOST_DEVICE inline void SgdElement(const ElementScalars& s, V g, V& param, V& buf,
                                      bool has_momentum) {
  if (s.weight_decay_on) g = g + V(s.weight_decay) * param;
  if (has_momentum) {
    buf = s.first_step ? g : buf * V(s.momentum) + V(s.one_minus_dampening) * g;
    g = s.nesterov ? g + V(s.momentum) * buf : buf;
  }
  param = param + V(-s.lr) * g;
}

// torch.optim.Adam (decoupled == false, L2 weight decay) and torch.optim.AdamW (decoupled).
// `max_exp_avg_sq` is used only under amsgrad.
template <class V>
ZS_HOST_DEVICE inline void AdamElement(const ElementScalars& s, bool decoupled, V g, V& param,
                                       V& exp_avg, V& exp_avg_sq, V& max_exp_avg_sq) {
  if (s.first_step) {
    exp_avg = V(0.0f);
    exp_avg_sq = V(0.0f);
    max_exp_avg_sq = V(0.0f);
  }
  if (decoupled) {
    param = param * V(s.decay_factor);
  } else if (s.weight_decay_on) {
    g = g + V(s.weight_decay) * param;
  }
  exp_avg = exp_avg * V(s.beta1) + V(s.one_minus_beta1) * g;
  exp_avg_sq = exp_avg_sq * V(s.beta2) + V(s.one_minus_beta2) * g * g;
  V second_moment = exp_avg_sq;
  if (s.amsgrad) {
    max_exp_avg_sq = Max(max_exp_avg_sq, exp_avg_sq);
    second_moment = max_exp_avg_sq;
  }
  const V denom = Sqrt(second_moment) / V(s.bias_correction2_sqrt) + V(s.eps);
  param = param + V(s.neg_step_size) * exp_avg / denom;
}

// torch.optim.Adagrad. `sum` is the accumulated squared gradient.
template <class V>
ZS_HOST_DEVICE inline void AdagradElement(const ElementScalars& s, V g, V& param, V& sum) {
  if (s.first_step) sum = V(s.initial_accumulator);
  if (s.weight_decay_on) g = g + V(s.weight_decay) * param;
  sum = sum + g * g;
  const V std_dev = Sqrt(sum) + V(s.eps);
  param = param + V(s.neg_step_size) * g / std_dev;
}

// Lion (Chen et al. 2023, Algorithm 2) with decoupled weight decay.
template <class V>
ZS_HOST_DEVICE inline void LionElement(const ElementScalars& s, V g, V& param, V& exp_avg) {
  if (s.first_step) exp_avg = V(0.0f);
  const V interpolated = exp_avg * V(s.beta1) + V(s.one_minus_beta1) * g;
  V update = Sign(interpolated);
  if (s.weight_decay_on) update = update + V(s.weight_decay) * param;
  param = param - V(s.lr) * update;
  exp_avg = exp_avg * V(s.beta2) + V(s.one_minus_beta2) * g;
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_UPDATE_MATH_H_
