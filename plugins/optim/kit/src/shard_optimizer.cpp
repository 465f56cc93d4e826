// ShardOptimizer: the device-resident optimizer skeleton of the optim kit
// (ciuic/kit/shard_optimizer.h).
#include <ciuic/kit/shard_optimizer.h>

#include <chrono>

#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <ciuic/error.h>
#include <ciuic/grad_norm.h>
#include <ciuic/metrics.h>
#include <ciuic/precision.h>

namespace ciuic::kit {

ShardOptimizer::ShardOptimizer(std::string who, std::vector<std::string> moment_names)
    : who_(std::move(who)), moment_names_(std::move(moment_names)) {}

void ShardOptimizer::require_setup(const char* what) const {
  if (!ready_) throw Error(who_ + ": " + what + "() called before setup()");
}

void ShardOptimizer::setup(const OptimizerSetup& s) {
  check_optimizer_setup(s, who_);
  c10::NoGradGuard ng;
  setup_ = s;
  setup_.initial.clear();  // views into the model: not kept
  positions_ = positions_of(setup_, 0, s.numel);
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(s.device);
  master_ = at::empty({s.numel}, opts);
  for (const ShardValues& piece : s.initial)
    master_.narrow(0, piece.shard_offset, piece.values.numel()).copy_(piece.values.reshape({-1}));
  // One chunk a step in a narrow dtype: nothing to accumulate, so the gradient stays as it came
  // (when update_shard() can read it).
  const bool narrow = s.one_chunk_per_step && s.grad_dtype != at::kFloat &&
                      takes_narrow_grads(s.grad_dtype, s.device);
  grad_ = at::zeros({s.numel}, opts.dtype(narrow ? s.grad_dtype : at::kFloat));
  moments_.clear();
  for (size_t k = 0; k < moment_names_.size(); ++k) moments_.push_back(at::zeros({s.numel}, opts));
  sum_sq_ = at::zeros({1}, opts.dtype(at::kDouble));
  ready_ = true;
}

void ShardOptimizer::accumulate_grad(int region, const at::Tensor& chunk, bool first, bool last) {
  require_setup("accumulate_grad");
  check_grad_chunk(setup_, region, chunk, who_);
  c10::NoGradGuard ng;
  const ShardRegion& r = setup_.grad_regions[static_cast<size_t>(region)];
  at::Tensor dst = grad_.narrow(0, r.offset, r.numel);
  if (first) {
    dst.copy_(chunk);
  } else {
    if (grad_.scalar_type() != at::kFloat)
      throw Error(who_ + ": region " + std::to_string(region) +
                  " received a second gradient chunk in one step, "
                  "but setup() promised one chunk per step (the gradient is kept in " +
                  c10::toString(grad_.scalar_type()) + ", which cannot accumulate)");
    dst.add_(chunk);
  }
  if (last) sum_sq_.add_(sum_of_squares(dst));
}

at::Tensor ShardOptimizer::finish_grads() {
  require_setup("finish_grads");
  at::Tensor total = sum_sq_.clone();
  sum_sq_.zero_();
  return total;
}

void ShardOptimizer::step(const OptimizerStep& args, at::Tensor& params_out) {
  require_setup("step");
  check_optimizer_step(setup_, args, params_out, who_);
  const auto t0 = std::chrono::steady_clock::now();
  c10::NoGradGuard ng;
  at::Tensor out = params_out.view({setup_.numel});
  const bool rounds_here = setup_.precision->rounds_to_nearest();
  if (update_shard(master_, grad_, moments_, rounds_here ? &out : nullptr, args)) {
    if (!rounds_here) setup_.precision->round_to_param(master_, out, args.t, positions_);
    last_step_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  if (grad_.scalar_type() != at::kFloat)
    throw Error(who_ + ": the gradient shard is " + c10::toString(grad_.scalar_type()) +
                " but update_shard() declined it (takes_narrow_grads() said it would take it)");
  if (args.grad_scale != 1.0) grad_.mul_(args.grad_scale);
  Group decay, plain;
  for (Group* g : {&decay, &plain}) g->moments.resize(moments_.size());
  for (const ShardSegment& seg : setup_.segments) {
    const int64_t n = seg.end - seg.begin;
    if (n == 0) continue;
    Group& g = seg.weight_decay && args.weight_decay != 0.0 ? decay : plain;
    g.master.push_back(master_.narrow(0, seg.begin, n));
    g.grad.push_back(grad_.narrow(0, seg.begin, n));
    for (size_t k = 0; k < moments_.size(); ++k)
      g.moments[k].push_back(moments_[k].narrow(0, seg.begin, n));
  }
  if (!decay.empty()) update(decay, args.lr, args.weight_decay, args.t);
  if (!plain.empty()) update(plain, args.lr, 0.0, args.t);
  setup_.precision->round_to_param(master_, out, args.t, positions_);
  last_step_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ShardOptimizer::write_params(at::Tensor& params_out, int64_t t) {
  require_setup("write_params");
  c10::NoGradGuard ng;
  at::Tensor out = params_out.view({setup_.numel});
  setup_.precision->round_to_param(master_, out, t, positions_);
}

std::vector<std::string> ShardOptimizer::state_names() const {
  std::vector<std::string> names{"master"};
  names.insert(names.end(), moment_names_.begin(), moment_names_.end());
  return names;
}

void ShardOptimizer::save_state(StateDict& out) const {
  require_setup("save_state");
  const auto cpu = at::TensorOptions().device(at::kCPU).dtype(at::kFloat);
  out.emplace_back("master", master_.to(cpu, /*non_blocking=*/false, /*copy=*/true));
  for (size_t k = 0; k < moments_.size(); ++k)
    out.emplace_back(moment_names_[k], moments_[k].to(cpu, false, true));
}

void ShardOptimizer::load_state(const StateDict& in) {
  require_setup("load_state");
  // Check every tensor before touching any, so a bad state leaves this object unchanged.
  const at::Tensor m = optimizer_state_tensor(in, "master", setup_.numel, who_);
  std::vector<at::Tensor> ms;
  for (const std::string& name : moment_names_)
    ms.push_back(optimizer_state_tensor(in, name, setup_.numel, who_));
  c10::NoGradGuard ng;
  master_.copy_(m);
  for (size_t k = 0; k < ms.size(); ++k) moments_[k].copy_(ms[k]);
}

bool ShardOptimizer::update_shard(at::Tensor&, const at::Tensor&, std::vector<at::Tensor>&,
                                  at::Tensor*, const OptimizerStep&) {
  return false;
}

bool ShardOptimizer::takes_narrow_grads(at::ScalarType, const c10::Device&) const { return false; }

OptimizerMemory ShardOptimizer::memory() const {
  OptimizerMemory m;
  if (ready_)
    m.device_bytes =
        static_cast<uint64_t>(1 + moments_.size()) * setup_.numel * sizeof(float) + grad_.nbytes();
  return m;
}

void ShardOptimizer::append_metrics(Metrics& out) const {
  out.set("optim_state_gib", static_cast<double>(memory().device_bytes) / (1 << 30));
  out.set("optim_step_s", last_step_s_);
}

void ShardOptimizer::plan_device_state(PlanContext& plan, int moments, const std::string& what,
                                       bool narrow_grads_on_cuda) {
  const double S =
      static_cast<double>(plan.shard_numel > 0 ? plan.shard_numel : plan.num_parameters);
  plan.add(what, true, S * 4.0 * (1 + moments),
           "fp32 x " + std::to_string(1 + moments) + " per shard element (" +
               std::to_string(static_cast<int64_t>(S)) + ")");
  if (narrow_grads_on_cuda && plan.cuda && plan.one_chunk_per_step && plan.grad_bytes < 4)
    plan.add(
        "gradient shard", true, S * plan.grad_bytes,
        std::to_string(plan.grad_bytes) + " bytes per element: one chunk a step, kept as it came");
  else
    plan.add("gradient shard", true, S * 4.0, "fp32, accumulated from reduced chunks");
}

void fused_adamw(ShardOptimizer::Group& g, double lr, double beta1, double beta2, double eps,
                 double weight_decay, int64_t t) {
  if (g.empty()) return;
  if (g.moments.size() != 2) throw Error("fused_adamw: the group needs exp_avg and exp_avg_sq");
  // The step count as the fused kernel wants it: an fp32 scalar tensor per list entry.
  const at::Tensor step = at::full({}, static_cast<double>(t), g.master[0].options());
  const std::vector<at::Tensor> steps(g.master.size(), step);
  at::_fused_adamw_(g.master, g.grad, g.moments[0], g.moments[1], /*max_exp_avg_sqs=*/{}, steps, lr,
                    beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false,
                    /*grad_scale=*/std::nullopt, /*found_inf=*/std::nullopt);
}

}  // namespace ciuic::kit
