// nf4_linear (quant/nf4.h): a frozen linear layer over an NF4 weight, as a custom autograd
// function that saves only the 4-bit state. Its own translation unit: the custom function header
// pulls in much of the autograd engine.
#include <string>
#include <utility>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/matmul.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ciuic/error.h>

#include "quant/nf4.h"

namespace ciuic::quant {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The Nf4Tensor rides in the context's saved_data: its tensors (shared, not copied) and scalars.
constexpr std::pair<const char*, at::Tensor Nf4Tensor::*> kTensors[] = {
    {"packed", &Nf4Tensor::packed},
    {"code", &Nf4Tensor::code},
    {"absmax", &Nf4Tensor::absmax},
    {"code2", &Nf4Tensor::code2},
    {"absmax2", &Nf4Tensor::absmax2}};

void save(AutogradContext* ctx, const Nf4Tensor& w) {
  for (const auto& [key, member] : kTensors)
    if ((w.*member).defined()) ctx->saved_data[key] = w.*member;
  ctx->saved_data["meta"] = std::vector<int64_t>{static_cast<int64_t>(w.dtype), w.blocksize};
  ctx->saved_data["offset"] = static_cast<double>(w.offset);
  ctx->saved_data["shape"] = w.shape;
}

Nf4Tensor restore(AutogradContext* ctx) {
  Nf4Tensor w;
  for (const auto& [key, member] : kTensors)
    if (ctx->saved_data.count(key)) w.*member = ctx->saved_data[key].toTensor();
  const std::vector<int64_t> meta = ctx->saved_data["meta"].toIntVector();
  w.dtype = static_cast<at::ScalarType>(meta[0]);
  w.blocksize = meta[1];
  w.offset = static_cast<float>(ctx->saved_data["offset"].toDouble());
  w.shape = ctx->saved_data["shape"].toIntVector();
  return w;
}

struct Nf4Linear : torch::autograd::Function<Nf4Linear> {
  // Input: x. The weight is not an autograd input (it has no gradient); the bias is added outside,
  // by ordinary autograd ops.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Nf4Tensor* w) {
    save(ctx, *w);
    return at::matmul(x, dequantize_nf4(*w, x.scalar_type()).t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    return {at::matmul(g, dequantize_nf4(restore(ctx), g.scalar_type())), at::Tensor()};
  }
};

}  // namespace

at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& w, const at::Tensor& bias) {
  if (!x.defined()) throw Error("nf4_linear: undefined input");
  if (w.shape.size() != 2)
    throw Error("nf4_linear: the NF4 weight must be 2-D [out, in], has " +
                std::to_string(w.shape.size()) + " dimensions");
  if (x.dim() < 1 || x.size(-1) != w.shape[1])
    throw Error("nf4_linear: input's last dimension " + std::to_string(x.dim() ? x.size(-1) : 0) +
                " does not match the weight's in_features " + std::to_string(w.shape[1]));
  if (!at::isFloatingType(x.scalar_type()))
    throw Error("nf4_linear: the input is not floating point");
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != w.shape[0]))
    throw Error("nf4_linear: bias must be [" + std::to_string(w.shape[0]) + "]");
  at::Tensor y = Nf4Linear::apply(x, &w);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace ciuic::quant
