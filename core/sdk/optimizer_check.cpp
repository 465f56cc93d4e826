// Argument checks shared by optimizer implementations (declared in ciuic/optimizer.h).
#include <algorithm>
#include <cmath>
#include <string>

#include <c10/core/ScalarType.h>

#include <ciuic/error.h>
#include <ciuic/optimizer.h>

namespace ciuic {

namespace {

std::string str(std::string_view who) { return std::string(who); }

bool supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return std::string("a ") + c10::toString(t.scalar_type()) + " tensor of " +
         std::to_string(t.numel()) + " elements on " + t.device().str() +
         (t.is_contiguous() ? "" : " (not contiguous)");
}

std::string range(int64_t a, int64_t n) {
  return "[" + std::to_string(a) + ", " + std::to_string(a + n) + ")";
}

}  // namespace

void check_optimizer_setup(const OptimizerSetup& s, std::string_view who) {
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
  expect = 0;
  for (size_t i = 0; i < s.grad_regions.size(); ++i) {
    const ShardRegion& r = s.grad_regions[i];
    if (r.offset != expect || r.numel < 0)
      throw Error(str(who) + ": setup() gradient region " + std::to_string(i) + " is " +
                  range(r.offset, r.numel) + "; regions must cover [0, " + std::to_string(s.numel) +
                  ") in order, the next one starting at " + std::to_string(expect));
    expect = r.offset + r.numel;
  }
  if (expect != s.numel)
    throw Error(str(who) + ": setup() gradient regions end at " + std::to_string(expect) +
                " but the shard has " + std::to_string(s.numel) + " elements");
  for (const ShardValues& v : s.initial) {
    const int64_t n = v.values.defined() ? v.values.numel() : 0;
    if (v.shard_offset < 0 || v.shard_offset + n > s.numel)
      throw Error(str(who) + ": setup() initial values " + range(v.shard_offset, n) +
                  " lie outside the shard [0, " + std::to_string(s.numel) + ")");
  }
  if (!supported_dtype(s.param_dtype))
    throw Error(str(who) + ": parameter dtype " + c10::toString(s.param_dtype) +
                " is not supported (fp32, bf16 or fp16)");
  if (!supported_dtype(s.grad_dtype))
    throw Error(str(who) + ": gradient dtype " + c10::toString(s.grad_dtype) +
                " is not supported (fp32, bf16 or fp16)");
  expect = 0;
  for (size_t i = 0; i < s.positions.size(); ++i) {
    const PositionSpan& p = s.positions[i];
    if (p.offset != expect || p.length < 0 || p.global < -1)
      throw Error(str(who) + ": setup() position span " + std::to_string(i) + " is " +
                  range(p.offset, p.length) + " at global " + std::to_string(p.global) +
                  "; spans must cover [0, " + std::to_string(s.numel) +
                  ") in order, the next one starting at " + std::to_string(expect));
    expect = p.offset + p.length;
  }
  if (!s.positions.empty() && expect != s.numel)
    throw Error(str(who) + ": setup() position spans end at " + std::to_string(expect) +
                " but the shard has " + std::to_string(s.numel) + " elements");
  if (!s.precision) throw Error(str(who) + ": setup() without a precision policy");
}

std::vector<PositionSpan> positions_of(const OptimizerSetup& s, int64_t shard_offset,
                                       int64_t numel) {
  std::vector<PositionSpan> out;
  if (s.positions.empty()) {  // no layout given: the shard is the model, element for element
    out.push_back(PositionSpan{0, numel, shard_offset});
    return out;
  }
  const int64_t end = shard_offset + numel;
  // The first span that ends after shard_offset (spans are in order).
  size_t i = 0, lo = 0, hi = s.positions.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (s.positions[mid].offset + s.positions[mid].length <= shard_offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (i = lo; i < s.positions.size() && s.positions[i].offset < end; ++i) {
    const PositionSpan& p = s.positions[i];
    const int64_t a = std::max(p.offset, shard_offset), b = std::min(p.offset + p.length, end);
    if (b <= a) continue;
    out.push_back(
        PositionSpan{a - shard_offset, b - a, p.global < 0 ? -1 : p.global + (a - p.offset)});
  }
  return out;
}

void check_grad_chunk(const OptimizerSetup& s, int region, const at::Tensor& chunk,
                      std::string_view who) {
  if (region < 0 || static_cast<size_t>(region) >= s.grad_regions.size())
    throw Error(str(who) + ": gradient chunk for region " + std::to_string(region) +
                ": there are " + std::to_string(s.grad_regions.size()) + " regions");
  const int64_t n = s.grad_regions[static_cast<size_t>(region)].numel;
  if (!chunk.defined() || chunk.numel() != n || chunk.scalar_type() != s.grad_dtype ||
      !chunk.is_contiguous() || (chunk.device() != s.device && !chunk.is_cpu()))
    throw Error(str(who) + ": gradient chunk for region " + std::to_string(region) +
                " must be a contiguous " + c10::toString(s.grad_dtype) + " tensor of " +
                std::to_string(n) + " elements on " + s.device.str() + ", got " + describe(chunk));
}

void check_optimizer_step(const OptimizerSetup& s, const OptimizerStep& a,
                          const at::Tensor& params_out, std::string_view who) {
  if (!params_out.defined() || params_out.numel() != s.numel || params_out.device() != s.device ||
      params_out.scalar_type() != s.param_dtype || !params_out.is_contiguous())
    throw Error(str(who) + ": step() params_out must be a contiguous " +
                c10::toString(s.param_dtype) + " tensor of " + std::to_string(s.numel) +
                " elements on " + s.device.str() + ", got " + describe(params_out));
  if (!(std::isfinite(a.grad_scale) && a.grad_scale > 0))
    throw Error(str(who) + ": step() grad_scale must be finite and > 0, got " +
                std::to_string(a.grad_scale));
  if (a.t < 1)
    throw Error(str(who) + ": step() step count t must be >= 1, got " + std::to_string(a.t));
}

at::Tensor optimizer_state_tensor(const StateDict& state, const std::string& key, int64_t numel,
                                  std::string_view who) {
  at::Tensor t = state_get(state, key);
  if (!t.defined()) throw Error(str(who) + ": optimizer state has no \"" + key + "\" tensor");
  if (t.scalar_type() != at::kFloat || t.dim() != 1 || t.numel() != numel)
    throw Error(str(who) + ": optimizer state \"" + key + "\" must be a 1-D fp32 tensor of " +
                std::to_string(numel) + " elements, got " + describe(t));
  return t;
}

}  // namespace ciuic
