// Argument checks shared by every Offload implementation (declared in ciuic/offload.h).
#include <cmath>
#include <string>

#include <c10/core/ScalarType.h>

#include <ciuic/error.h>
#include <ciuic/offload.h>

namespace ciuic {

namespace {

std::string str(std::string_view who) { return std::string(who); }

bool supported_param_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return std::string(c10::toString(t.scalar_type())) + " tensor of " +
         std::to_string(t.numel()) + " elements on " + t.device().str();
}

}  // namespace

void check_offload_setup(const OffloadSetup& s, std::string_view who) {
  if (s.numel < 0) throw Error(str(who) + ": setup() with numel " + std::to_string(s.numel));
  int64_t expect = 0;
  for (size_t i = 0; i < s.segments.size(); ++i) {
    const ShardSegment& seg = s.segments[i];
    if (seg.begin != expect || seg.end < seg.begin)
      throw Error(str(who) + ": setup() segment " + std::to_string(i) + " is [" +
                  std::to_string(seg.begin) + ", " + std::to_string(seg.end) +
                  "); segments must cover [0, " + std::to_string(s.numel) +
                  ") in order, the next one starting at " + std::to_string(expect));
    expect = seg.end;
  }
  if (expect != s.numel)
    throw Error(str(who) + ": setup() segments end at " + std::to_string(expect) +
                " but the shard has " + std::to_string(s.numel) + " elements");
  if (!s.master_init.defined() || s.master_init.scalar_type() != at::kFloat ||
      s.master_init.numel() != s.numel)
    throw Error(str(who) + ": setup() master_init must be an fp32 tensor of " +
                std::to_string(s.numel) + " elements, got " + describe(s.master_init));
  if (!supported_param_dtype(s.param_dtype))
    throw Error(str(who) + ": parameter dtype " + c10::toString(s.param_dtype) +
                " is not supported (fp32, bf16 or fp16)");
}

void check_offload_step(int64_t numel, c10::Device device, at::ScalarType param_dtype,
                        const at::Tensor& grad, double grad_scale, int64_t t,
                        const at::Tensor& params_out, std::string_view who) {
  // The gradient may also be in host memory (Offload::wants_host_grad()).
  if (!grad.defined() || grad.numel() != numel || (grad.device() != device && !grad.is_cpu()) ||
      !supported_param_dtype(grad.scalar_type()) || !grad.is_contiguous())
    throw Error(str(who) + ": step() gradient must be a contiguous fp32, bf16 or fp16 tensor of " +
                std::to_string(numel) + " elements on " + device.str() +
                (device.is_cpu() ? "" : " or in host memory") + ", got " + describe(grad));
  if (!params_out.defined() || params_out.numel() != numel || params_out.device() != device ||
      params_out.scalar_type() != param_dtype || !params_out.is_contiguous())
    throw Error(str(who) + ": step() params_out must be a contiguous " +
                c10::toString(param_dtype) + " tensor of " + std::to_string(numel) +
                " elements on " + device.str() + ", got " + describe(params_out));
  if (!(std::isfinite(grad_scale) && grad_scale > 0))
    throw Error(str(who) + ": step() grad_scale must be finite and > 0, got " +
                std::to_string(grad_scale));
  if (t < 1) throw Error(str(who) + ": step() step count t must be >= 1, got " + std::to_string(t));
}

at::Tensor offload_state_tensor(const StateDict& state, const std::string& key, int64_t numel,
                                std::string_view who) {
  at::Tensor t = state_get(state, key);
  if (!t.defined())
    throw Error(str(who) + ": optimizer state has no \"" + key +
                "\" tensor (expected \"master\", \"exp_avg\", \"exp_avg_sq\")");
  if (t.scalar_type() != at::kFloat || t.dim() != 1 || t.numel() != numel)
    throw Error(str(who) + ": optimizer state \"" + key + "\" must be a 1-D fp32 tensor of " +
                std::to_string(numel) + " elements, got a " + std::to_string(t.dim()) + "-D " +
                describe(t));
  return t;
}

}  // namespace ciuic
