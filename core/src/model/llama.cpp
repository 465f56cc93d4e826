// LlamaModel: parameters, weight loading, forward, loss and greedy generation.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_fill.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Storage.h>
#include <c10/util/strides.h>

#include <ciuic/error.h>

#include "base/paths.h"
#include "model/cpu_skinny_gemm.h"
#include "model/fused_ops.h"
#include "model/safetensors.h"

namespace ciuic::model {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::string s = std::string(c10::toString(t.scalar_type())) + " [";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] on " + t.device().str();
}

// A tensor of `shape` whose storage has no memory (a sharding gives it memory later).
at::Tensor without_memory(c10::IntArrayRef shape, const at::TensorOptions& opts) {
  at::Tensor t = at::empty({0}, opts);  // resolves "cuda" to the current device; allocates nothing
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  c10::Storage storage(c10::Storage::use_byte_size_t(), n * static_cast<int64_t>(t.element_size()),
                       at::DataPtr(nullptr, t.device()), t.storage().allocator(),
                       /*resizable=*/false);
  return t.set_(storage, 0, shape, c10::contiguous_strides(shape));
}

bool onednn_head_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("CIUIC_ONEDNN_HEAD");
    return !(e && std::string(e) == "0") && at::hasMKLDNN() &&
           c10::Dispatcher::singleton().findSchema({"mkldnn::_reorder_linear_weight", ""}) &&
           c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  }();
  return on;
}

}  // namespace

LlamaModel::LlamaModel(const LlamaConfig& cfg, at::ScalarType dtype, c10::Device device,
                       bool allocate)
    : cfg_(cfg),
      shape_(LayerShape::of(cfg)),
      dtype_(dtype),
      device_(device),
      slots_(layer_slots(cfg)) {
  cfg_.validate("LlamaModel config");
  shape_.fused = fused_kernels_supported(dtype, device);
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
    throw Error(
        std::string("LlamaModel: parameter dtype must be float32, bfloat16 or float16, not ") +
        c10::toString(dtype));
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  layers_.resize(static_cast<size_t>(cfg.num_hidden_layers));
  // Allocated in named_parameters() order, from the one list of names and shapes.
  size_t i = 0;
  for (const auto& spec : llama_parameter_specs(cfg)) {
    at::Tensor p = (allocate ? at::empty(spec.shape, opts) : without_memory(spec.shape, opts))
                       .requires_grad_(true);
    if (spec.layer >= 0)
      layers_[static_cast<size_t>(spec.layer)].t[spec.slot] = p;
    else if (i == 0)
      embed_ = p;
    else if (spec.name == "model.norm.weight")
      norm_ = p;
    else
      lm_head_ = p;
    ++i;
  }
  device_ = embed_.device();  // "cuda" becomes "cuda:<current>": inputs are compared against it
  inv_freq_ = rope_inv_freq(cfg_).to(device_);
  if (cfg_.local_rope) inv_freq_local_ = rope_inv_freq(cfg_, /*local=*/true).to(device_);
  // transformers multiplies by the scale as a tensor in the weights' dtype.
  if (cfg_.scale_embeddings)
    embed_scale_ = at::scalar_tensor(std::sqrt(static_cast<double>(cfg_.hidden_size)), at::kFloat)
                       .to(dtype)
                       .item<double>();
}

LlamaModel::~LlamaModel() = default;

std::unique_ptr<LlamaModel> LlamaModel::from_pretrained(const std::string& folder,
                                                        at::ScalarType dtype, c10::Device device) {
  const std::string config_path = (std::filesystem::path(folder) / "config.json").string();
  if (const std::string why = paths::problem(config_path, paths::Want::kAny); !why.empty())
    throw Error(folder + ": no config.json (expected a Hugging Face model folder): " + config_path +
                ": " + why);
  auto model = std::make_unique<LlamaModel>(LlamaConfig::from_file(config_path), dtype, device);
  model->load_hf(folder);
  return model;
}

std::vector<LlamaParamSpec> llama_parameter_specs(const LlamaConfig& cfg) {
  const int64_t h = cfg.hidden_size, q = cfg.num_attention_heads * cfg.head_dim,
                kv = cfg.num_key_value_heads * cfg.head_dim, m = cfg.intermediate_size,
                d = cfg.head_dim;
  // By slot (LayerWeights::Slot order).
  const std::vector<int64_t> layer_shapes[LayerWeights::kCount] = {
      {q, h}, {q},    {kv, h}, {kv},   {kv, h}, {kv}, {h, q}, {d},
      {d},    {m, h}, {m, h},  {h, m}, {h},     {h},  {h},    {h}};
  std::vector<LlamaParamSpec> out;
  out.push_back({"model.embed_tokens.weight", {cfg.vocab_size, h}, -1, -1});
  const std::vector<int> slots = layer_slots(cfg);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (int j : slots)
      out.push_back({"model.layers." + std::to_string(l) + "." + LayerWeights::kNames[j],
                     layer_shapes[j], l, j});
  out.push_back({"model.norm.weight", {h}, -1, -1});
  if (!cfg.tie_word_embeddings) out.push_back({"lm_head.weight", {cfg.vocab_size, h}, -1, -1});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(3 + layers_.size() * slots_.size());
  out.emplace_back("model.embed_tokens.weight", embed_);
  for (size_t i = 0; i < layers_.size(); ++i)
    for (int j : slots_)
      if (layers_[i].t[j].defined())  // not a weight quantize_base stored as NF4
        out.emplace_back("model.layers." + std::to_string(i) + "." + LayerWeights::kNames[j],
                         layers_[i].t[j]);
  out.emplace_back("model.norm.weight", norm_);
  if (lm_head_.defined()) out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

void LlamaModel::enable_lora(const LoraSpec& spec) {
  if (lora_) throw Error("LlamaModel::enable_lora: an adapter is already attached");
  if (spec.r <= 0) throw Error("LlamaModel::enable_lora: r must be > 0");
  if (spec.targets.empty()) throw Error("LlamaModel::enable_lora: no target modules");
  if (spec.untied_save && cfg_.tie_word_embeddings)
    throw UsageError(
        "the adapter's modules_to_save trains a copy of a tied module without "
        "ensure_weight_tying (PEFT then trains the embedding and lm_head apart); ciuic trains "
        "the tied tensor once: save the adapter with ensure_weight_tying = true");
  const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  for (auto& w : layers_)
    for (int slot : spec.targets) {
      const int a = LayerWeights::lora_a_slot(slot);
      const quant::Nf4Tensor* q = w.nf4_of(slot);
      if (a < 0 || (!w.t[slot].defined() && !q))
        throw Error("LlamaModel::enable_lora: slot " + std::to_string(slot) +
                    " is not a linear layer");
      const int64_t out = q ? q->shape[0] : w.t[slot].size(0);
      const int64_t in = q ? q->shape[1] : w.t[slot].size(1);
      w.t[a] = at::empty({spec.r, in}, opts).requires_grad_(true);
      w.t[a + 1] = at::empty({out, spec.r}, opts).requires_grad_(true);
    }
  for (auto& [name, t] : named_parameters()) {
    const bool save =
        (name == "model.embed_tokens.weight" && spec.save_embed) ||
        (name == "lm_head.weight" && spec.save_lm_head) ||
        (name == "model.embed_tokens.weight" && spec.save_lm_head && cfg_.tie_word_embeddings);
    t.requires_grad_(save);
  }
  lora_ = spec;
  lora_->tied = cfg_.tie_word_embeddings;
  shape_.lora_scale = spec.scaling();
  shape_.lora_dropout = spec.dropout;
}

void LlamaModel::init_lora(uint64_t seed) {
  if (!lora_) throw Error("LlamaModel::init_lora: no adapter (enable_lora)");
  at::NoGradGuard no_grad;
  at::Generator base = at::globalContext().defaultGenerator(device_);
  uint64_t index = 0;
  for (auto& [name, t] : lora_parameters()) {
    ++index;
    if (name.ends_with("lora_B.weight")) {
      t.zero_();
      continue;
    }
    at::Generator gen = base.clone();
    gen.set_current_seed(splitmix64(seed ^ splitmix64(index) ^ 0x4c6f5241ull));
    at::Tensor f = at::empty(t.sizes(), t.options().dtype(at::kFloat));
    if (lora_->init == LoraInit::kGaussian) {
      f.normal_(0.0, 1.0 / static_cast<double>(lora_->r), gen);
    } else {  // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 /
              // fan_in)
      const double bound = std::sqrt(1.0 / 3.0) * std::sqrt(3.0 / static_cast<double>(t.size(1)));
      f.uniform_(-bound, bound, gen);
    }
    t.copy_(f);
  }
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::lora_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < layers_.size(); ++i)
    for (int j = LayerWeights::kQLoraA; j < LayerWeights::kCount; ++j)
      if (layers_[i].t[j].defined())
        out.emplace_back("model.layers." + std::to_string(i) + "." + LayerWeights::kNames[j],
                         layers_[i].t[j]);
  return out;
}

void LlamaModel::load_lora(const SafetensorsReader& reader) {
  if (!lora_) throw Error("LlamaModel::load_lora: no adapter (enable_lora)");
  std::set<std::string> expected;
  const std::string prefix = "base_model.model.";
  for (const auto& [name, t] : trainable_parameters()) {
    const std::string key = prefix + name;
    expected.insert(key);
    if (!reader.contains(key))
      throw Error(reader.path() + ": missing tensor `" + key + "` of a rank-" +
                  std::to_string(lora_->r) +
                  " adapter (do target_modules and modules_to_save match the adapter's "
                  "adapter_config.json?)");
    reader.check_loadable(key, t);  // a shape that differs: named with both shapes
  }
  // A tied modules_to_save: PEFT writes the trained tensor under lm_head's key too.
  if (lora_->tied && (lora_->save_embed || lora_->save_lm_head))
    expected.insert(prefix + "lm_head.weight");
  for (const auto& name : reader.names())
    if (!expected.count(name))
      throw Error(
          reader.file_of(name) + ": unexpected tensor `" + name +
          "`: not one of the adapter's parameters (do target_modules and modules_to_save match?)");
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : trainable_parameters()) reader.load_into(prefix + name, t);
}

void LlamaModel::merge_lora() {
  if (!lora_) throw Error("LlamaModel::merge_lora: no adapter (enable_lora)");
  at::NoGradGuard no_grad;
  for (auto& w : layers_) {
    for (int i = 0; i < LayerWeights::kNumLinear; ++i) {
      if (!w.nf4[i]) continue;
      const int slot = LayerWeights::kLinear[i];
      at::Tensor dense = quant::dequantize_nf4(*w.nf4[i], at::kFloat);
      if (std::find(lora_->targets.begin(), lora_->targets.end(), slot) != lora_->targets.end()) {
        const int a = LayerWeights::lora_a_slot(slot);
        dense += at::matmul(w.t[a + 1].to(at::kFloat), w.t[a].to(at::kFloat)) * lora_->scaling();
      }
      w.t[slot] = dense.to(dtype_);
      w.nf4[i] = nullptr;
    }
    for (int slot : lora_->targets) {
      if (!base_quantized()) {
        const int a = LayerWeights::lora_a_slot(slot);
        at::Tensor delta =
            at::matmul(w.t[a + 1].to(at::kFloat), w.t[a].to(at::kFloat)) * lora_->scaling();
        w.t[slot].copy_(w.t[slot].to(at::kFloat) + delta);
      }
    }
  }
  nf4_.clear();
}

void LlamaModel::quantize_base(const ciuic::ParamValues& values, int64_t blocksize,
                               bool double_quant, const QuantizeProgress& progress) {
  if (base_quantized()) throw Error("LlamaModel::quantize_base: the base is already quantized");
  at::NoGradGuard no_grad;
  const auto params = named_parameters();
  std::vector<std::unique_ptr<quant::Nf4Tensor>> stored;
  std::vector<std::pair<LayerWeights*, int>> where;  // (layer, linear index) of each stored
  // Where each weight is quantized: on the model's device when quant::quantize_nf4 runs there (CUDA
  // builds on CUDA), else on the CPU.
  const c10::Device at_device = quant::nf4_quantizes_on(device_) ? device_ : c10::Device(at::kCPU);
  const auto specs = llama_parameter_specs(cfg_);
  int64_t total = 0, done = 0;
  for (const auto& spec : specs)
    if (spec.layer >= 0 && LayerWeights::linear_index(spec.slot) >= 0) ++total;
  if (progress) progress(0, total);
  size_t index = 0;
  for (const auto& spec : specs) {
    const at::Tensor& p = params[index].second;
    const int lin = spec.layer >= 0 ? LayerWeights::linear_index(spec.slot) : -1;
    if (lin < 0) {
      if (values && !p.storage().data()) p.set_data(at::empty(p.sizes(), p.options()));
      if (values) values(static_cast<int>(index), 0, p.detach().view({-1}));
    } else {
      at::Tensor w = p;
      if (values) {  // the weight only in a temporary where it is quantized
        w = at::empty({p.numel()}, at::TensorOptions().dtype(dtype_).device(at_device));
        values(static_cast<int>(index), 0, w);
        w = w.view(p.sizes());
      } else if (!p.storage().data()) {
        throw Error("LlamaModel::quantize_base: " + spec.name +
                    " holds no memory (a model built with allocate = false needs `values`)");
      }
      quant::Nf4Tensor q = quant::quantize_nf4(w.detach().to(at_device), blocksize, double_quant);
      w = at::Tensor();  // the temporary freed before the next weight
      for (at::Tensor* t : {&q.packed, &q.code, &q.absmax, &q.code2, &q.absmax2})
        if (t->defined()) *t = t->to(device_);
      stored.push_back(std::make_unique<quant::Nf4Tensor>(std::move(q)));
      where.emplace_back(&layers_[static_cast<size_t>(spec.layer)], lin);
      if (progress && ++done < total) progress(done, total);
    }
    ++index;
  }
  for (size_t k = 0; k < stored.size(); ++k) {
    auto [layer, lin] = where[k];
    layer->nf4[lin] = stored[k].get();
    layer->t[LayerWeights::kLinear[lin]] = at::Tensor();  // the dense weight freed
  }
  nf4_ = std::move(stored);
  if (progress && total > 0) progress(total, total);
}

std::vector<std::pair<std::string, const quant::Nf4Tensor*>> LlamaModel::nf4_weights() const {
  std::vector<std::pair<std::string, const quant::Nf4Tensor*>> out;
  for (size_t i = 0; i < layers_.size(); ++i)
    for (int j : slots_)
      if (const quant::Nf4Tensor* q = layers_[i].nf4_of(j))
        out.emplace_back("model.layers." + std::to_string(i) + "." + LayerWeights::kNames[j], q);
  return out;
}

int64_t LlamaModel::nf4_bytes() const {
  int64_t n = 0;
  for (const auto& q : nf4_) n += q->bytes();
  return n;
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::trainable_parameters() const {
  if (!lora_) return named_parameters();
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (embed_.requires_grad()) out.emplace_back("model.embed_tokens.weight", embed_);
  for (auto& p : lora_parameters()) out.push_back(std::move(p));
  if (lm_head_.defined() && lm_head_.requires_grad()) out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

std::vector<ciuic::ParamGroup> LlamaModel::trainable_param_groups() const {
  if (!lora_) return param_groups();
  std::vector<ciuic::ParamGroup> out;
  int next = 0;
  out.push_back({"embed", {}});
  if (embed_.requires_grad()) out.back().params.push_back(next++);
  for (size_t i = 0; i < layers_.size(); ++i) {
    ciuic::ParamGroup g{"layers." + std::to_string(i), {}};
    for (int j = LayerWeights::kQLoraA; j < LayerWeights::kCount; ++j)
      if (layers_[i].t[j].defined()) g.params.push_back(next++);
    out.push_back(std::move(g));
  }
  out.push_back({"head", {}});
  if (lm_head_.defined() && lm_head_.requires_grad())
    out.back().params.push_back(next);
  else if (cfg_.tie_word_embeddings && embed_.requires_grad())
    out.back().params.push_back(0);
  return out;
}

std::vector<at::Tensor> LlamaModel::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

void LlamaModel::set_loss_chunk_elements(int64_t n) {
  if (n <= 0) throw Error("LlamaModel: loss chunk size must be positive");
  loss_chunk_elements_ = n;
}

int64_t LlamaModel::loss_chunk_elements(int64_t tokens) const {
  if (loss_chunk_elements_ > 0) return loss_chunk_elements_;
  if (loss_backward_ == LossBackward::kRecompute) return kDefaultLossChunkElements;
  return std::max(kDefaultLossChunkElements, std::min<int64_t>(tokens, 2048) * cfg_.vocab_size);
}

void LlamaModel::set_fused_kernels(bool on) {
  shape_.fused = on && fused_kernels_supported(dtype_, device_);
}

void LlamaModel::init_random(uint64_t seed, double std) {
  at::NoGradGuard no_grad;
  size_t index = 0;
  for (auto& [name, t] : named_parameters()) init_parameter(index++, name, t, seed, std);
}

void LlamaModel::init_parameter(size_t index, const std::string& name, const at::Tensor& t,
                                uint64_t seed, double std) const {
  at::NoGradGuard no_grad;
  if (t.dim() == 1) {
    // Biases 0; RMSNorm weights 1, or 0 where the norm scales by (1 + w).
    t.fill_(name.ends_with(".bias") || cfg_.gemma_norm ? 0.0 : 1.0);
    return;
  }
  at::Generator gen = at::globalContext().defaultGenerator(device_).clone();
  gen.set_current_seed(splitmix64(seed ^ splitmix64(index + 1)));
  // Drawn in fp32 whatever the parameter dtype, so that fp32, bf16 and fp16 runs of one seed
  // start from the same weights (up to rounding).
  if (t.scalar_type() == at::kFloat)
    t.normal_(0.0, std, gen);
  else
    t.copy_(at::empty(t.sizes(), t.options().dtype(at::kFloat)).normal_(0.0, std, gen));
  if (index == 0 && cfg_.padding_idx() >= 0) t[cfg_.padding_idx()].zero_();  // the embedding
}

void LlamaModel::init_random_values(int param, int64_t offset, const at::Tensor& out, uint64_t seed,
                                    double std) const {
  const auto params = named_parameters();
  if (param < 0 || param >= static_cast<int>(params.size()))
    throw Error("LlamaModel::init_random_values: parameter " + std::to_string(param) + " of " +
                std::to_string(params.size()));
  const auto& [name, p] = params[static_cast<size_t>(param)];
  if (offset < 0 || offset + out.numel() > p.numel())
    throw Error("LlamaModel::init_random_values: elements [" + std::to_string(offset) + ", +" +
                std::to_string(out.numel()) + ") of " + name + " (" + std::to_string(p.numel()) +
                " elements)");
  at::NoGradGuard no_grad;
  if (offset == 0 && out.numel() == p.numel() && out.device() == device_ &&
      out.scalar_type() == dtype_ && out.is_contiguous()) {  // the whole parameter: drawn in place
    init_parameter(static_cast<size_t>(param), name, out.view(p.sizes()), seed, std);
    return;
  }
  const at::Tensor whole = at::empty(p.sizes(), at::TensorOptions().dtype(dtype_).device(device_));
  init_parameter(static_cast<size_t>(param), name, whole, seed, std);
  out.copy_(whole.reshape({-1}).narrow(0, offset, out.numel()));
}

void LlamaModel::load_hf(const std::string& path) { load_hf(SafetensorsReader::open(path)); }

void LlamaModel::load_hf(const SafetensorsReader& reader) {
  check_hf(reader);
  for (const auto& [name, t] : named_parameters()) reader.load_into(name, t);
}

void LlamaModel::check_hf(const SafetensorsReader& reader) const {
  const auto params = named_parameters();
  std::set<std::string> expected;
  std::vector<std::string> missing;
  for (const auto& [name, t] : params) {
    expected.insert(name);
    if (!reader.contains(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    std::string msg = reader.path() + ": missing tensor `" + missing[0] + "`";
    if (missing.size() > 1) msg += " (and " + std::to_string(missing.size() - 1) + " more)";
    throw Error(msg + " for a " + model_type_name(cfg_.family) + " model with " +
                std::to_string(cfg_.num_hidden_layers) + " layers" +
                (cfg_.tie_word_embeddings ? ", tied embeddings" : ", untied embeddings"));
  }
  std::vector<std::string> unexpected;
  for (const auto& name : reader.names()) {
    if (expected.count(name)) continue;
    if (name.ends_with(".rotary_emb.inv_freq")) continue;  // old checkpoints' rope buffers
    if (cfg_.tie_word_embeddings && name == "lm_head.weight")
      continue;  // tied: the embedding is used
    unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::string msg = reader.file_of(unexpected[0]) + ": unexpected tensor `" + unexpected[0] + "`";
    if (unexpected.size() > 1) msg += " (and " + std::to_string(unexpected.size() - 1) + " more)";
    throw Error(msg + ": not part of a " + std::string(model_type_name(cfg_.family)) +
                " model with " + std::to_string(cfg_.num_hidden_layers) +
                " layers (does config.json match the weights?)");
  }
  for (const auto& [name, t] : params)
    reader.check_loadable(name, t);  // all checks before any copy
}

void LlamaModel::check_tokens(const at::Tensor& t, const char* what, c10::IntArrayRef shape) const {
  const bool ok = t.defined() && t.dim() == 2 &&
                  (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt) &&
                  t.device() == device_ && (shape.empty() || t.sizes() == shape);
  if (!ok) {
    std::string want = "a [B, T] int64 or int32 tensor on " + device_.str();
    if (!shape.empty()) want += " shaped like input_ids";
    throw Error(std::string("LlamaModel: ") + what + " must be " + want + ", got " + describe(t));
  }
}

at::Tensor LlamaModel::hidden_impl(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                   bool packed, const PackedDocs* docs,
                                   std::vector<KVCacheLayer>* cache,
                                   const CacheMasks* cache_masks) const {
  check_tokens(input_ids, "input_ids", {});
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  at::Tensor pos = position_ids;
  if (pos.defined()) {
    check_tokens(pos, "position_ids", input_ids.sizes());
  } else {
    pos = at::arange(t, at::TensorOptions().dtype(at::kLong).device(device_))
              .unsqueeze(0)
              .expand({b, t});
    packed = false;  // one document per row
  }
  const RopeTables rope = rope_tables(inv_freq_, pos, dtype_);
  RopeTables rope_local;
  if (inv_freq_local_.defined()) rope_local = rope_tables(inv_freq_local_, pos, dtype_);
  if (docs) {
    if (!packed)
      throw Error(
          "LlamaModel: document boundaries (PackedDocs) given for a batch not marked packed");
    if (docs->rows != b || docs->row_len != t || !docs->cu_seqlens.defined() ||
        docs->cu_seqlens.device() != device_)
      throw Error(
          "LlamaModel: PackedDocs were built for [" + std::to_string(docs->rows) + ", " +
          std::to_string(docs->row_len) + "] position_ids (cu_seqlens on " +
          (docs->cu_seqlens.defined() ? docs->cu_seqlens.device().str() : std::string("nothing")) +
          "), the batch is [" + std::to_string(b) + ", " + std::to_string(t) + "] on " +
          device_.str());
    if (!varlen_attention_supported(dtype_, device_, cfg_.head_dim))
      docs = nullptr;  // the mask does it
  }
  // Windowed layers: when the window is shorter than the rows, flash varlen with the window on
  // CUDA (the rows as documents when not packed), else a mask.
  bool windowed = false;
  for (int64_t i = 0; i < cfg_.num_hidden_layers && !windowed; ++i)
    windowed = cfg_.layer_slides(i) && cfg_.sliding_window < t;
  PackedDocs row_docs;
  if (windowed && !docs && !cache && varlen_attention_supported(dtype_, device_, cfg_.head_dim)) {
    row_docs.cu_seqlens =
        at::arange(0, b * t + 1, t, at::TensorOptions().dtype(at::kInt).device(device_));
    row_docs.max_len = t;
    row_docs.rows = b;
    row_docs.row_len = t;
    docs = &row_docs;
  }
  std::optional<at::Tensor> mask, window_mask;
  if (packed && !docs) mask = packed_causal_mask(pos);
  if (windowed && !docs && !cache_masks) {
    window_mask = sliding_causal_mask(t, cfg_.sliding_window, device_);
    if (mask) window_mask = mask->logical_and(*window_mask);
  }
  if (cache_masks) {
    mask.reset();
    window_mask.reset();
    if (cache_masks->full.defined()) mask = cache_masks->full;
    if (cache_masks->window.defined()) window_mask = cache_masks->window;
  }
  // Group g = 0 (embedding), 1 + i (layer i), head_group(); a boundary between each
  // (group_boundary).
  announce_before(0);
  at::Tensor h = at::embedding(embed_, input_ids, cfg_.padding_idx());
  if (cfg_.scale_embeddings) h = h * embed_scale_;
  // A frozen embedding (LoRA): its output needs no gradient, so no boundary node would end layer
  // 0's backward; a leaf that asks for one puts the boundary back (one [B, T, hidden] gradient).
  if (boundaries_ && lora_ && at::GradMode::is_enabled() && !h.requires_grad())
    h = h.detach().requires_grad_(true);
  announce_after(0);
  const bool ckpt = checkpointing_ && cache == nullptr && at::GradMode::is_enabled();
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int g = static_cast<int>(i) + 1;
    h = group_boundary(h, boundaries_, g, g - 1);
    announce_before(g);
    const bool slides = cfg_.layer_slides(static_cast<int64_t>(i));
    LayerShape s = shape_;
    if (slides) s.window = cfg_.sliding_window;
    if (!at::GradMode::is_enabled()) s.lora_dropout = 0;  // dropout while training only
    s.decode = cache != nullptr;  // generation: products through decode_linear
    const RopeTables& r = slides && inv_freq_local_.defined() ? rope_local : rope;
    const std::optional<at::Tensor>& m = slides && window_mask ? window_mask : mask;
    if (ckpt && (checkpoint_layers_ <= 0 || static_cast<int64_t>(i) < checkpoint_layers_))
      h = checkpointed_decoder_layer(layers_[i], s, h, r, m, docs, boundaries_, g);
    else
      h = decoder_layer(layers_[i], s, h, r, m, cache ? &(*cache)[i] : nullptr, docs);
    announce_after(g);
  }
  h = group_boundary(h, boundaries_, head_group(), head_group() - 1);
  announce_before(head_group());
  return h;
}

at::Tensor LlamaModel::head_begin(const at::Tensor& h) const {
  return rms_norm_of(h, norm_, cfg_.hidden_size, cfg_.rms_norm_eps, cfg_.gemma_norm, shape_.fused);
}

at::Tensor LlamaModel::head_end(const at::Tensor& out) const {
  announce_after(head_group());
  return group_boundary(out, boundaries_, -1, head_group());
}

void LlamaModel::announce_before(int group) const {
  if (boundaries_) boundaries_->before_group(group, ciuic::GroupPass::kForward);
}

void LlamaModel::announce_after(int group) const {
  if (boundaries_) boundaries_->after_group(group, ciuic::GroupPass::kForward);
}

std::vector<ciuic::ParamGroup> LlamaModel::param_groups() const {
  // named_parameters() order: the embedding, each layer's slots, the norm, lm_head.
  std::vector<ciuic::ParamGroup> out;
  out.push_back({"embed", {0}});
  int next = 1;
  for (size_t i = 0; i < layers_.size(); ++i) {
    ciuic::ParamGroup g{"layers." + std::to_string(i), {}};
    for (int j : slots_)
      if (layers_[i].t[j].defined()) g.params.push_back(next++);  // NF4 weights are not listed
    out.push_back(std::move(g));
  }
  const int norm = next++;
  out.push_back({"head", {norm, lm_head_.defined() ? next : 0}});
  return out;
}

at::Tensor LlamaModel::hidden_states(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                     bool packed, const PackedDocs* docs) const {
  return head_end(head_begin(hidden_impl(input_ids, position_ids, packed, docs, nullptr)));
}

at::Tensor LlamaModel::forward(const at::Tensor& input_ids, const at::Tensor& position_ids,
                               bool packed, const PackedDocs* docs) const {
  return head_end(at::linear(
      head_begin(hidden_impl(input_ids, position_ids, packed, docs, nullptr)), lm_head_weight()));
}

at::Tensor LlamaModel::loss_sum(const at::Tensor& input_ids, const at::Tensor& labels,
                                const at::Tensor& position_ids, bool packed,
                                const PackedDocs* docs) const {
  check_tokens(input_ids, "input_ids", {});
  check_tokens(labels, "labels", input_ids.sizes());
  const at::Tensor h = head_begin(hidden_impl(input_ids, position_ids, packed, docs, nullptr));
  return head_end(linear_cross_entropy_sum(h.reshape({-1, cfg_.hidden_size}), lm_head_weight(),
                                           labels.reshape({-1}).to(at::kLong),
                                           loss_chunk_elements(labels.numel()), loss_backward_));
}

std::vector<int32_t> LlamaModel::generate_greedy(const std::vector<int32_t>& prompt,
                                                 int64_t max_new_tokens,
                                                 std::optional<int32_t> stop_id) const {
  if (prompt.empty())
    throw Error("LlamaModel::generate_greedy: the prompt is empty (need at least one token)");
  for (int32_t id : prompt)
    if (id < 0 || id >= cfg_.vocab_size)
      throw Error("LlamaModel::generate_greedy: prompt token " + std::to_string(id) +
                  " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
  at::NoGradGuard no_grad;
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device_);
  std::vector<KVCacheLayer> cache(layers_.size());
  std::vector<int64_t> ids64(prompt.begin(), prompt.end());
  at::Tensor ids = at::tensor(ids64, at::TensorOptions().dtype(at::kLong)).to(device_).unsqueeze(0);
  at::Tensor pos = at::arange(static_cast<int64_t>(prompt.size()), long_opts).unsqueeze(0);
  std::vector<int32_t> out;
  int64_t next_pos = static_cast<int64_t>(prompt.size());
  // A small model on one CPU thread, as in model::generate (SmallStepThreads).
  const SmallStepThreads threads(device_, largest_product_flops(cfg_, 1, 1));
  while (static_cast<int64_t>(out.size()) < max_new_tokens) {
    at::Tensor h = head_begin(hidden_impl(ids, pos, false, nullptr, &cache));
    at::Tensor logits =
        head_end(decode_linear(h.select(1, h.size(1) - 1), lm_head_weight()));  // [1, V]
    const auto next = static_cast<int32_t>(logits.argmax(-1).item<int64_t>());
    out.push_back(next);
    if (stop_id && next == *stop_id) break;
    ids = at::full({1, 1}, next, long_opts);
    pos = at::full({1, 1}, next_pos++, long_opts);
  }
  return out;
}

LlamaModel::DecodeCache LlamaModel::new_decode_cache(int64_t batch, int64_t capacity,
                                                     bool no_padding) const {
  if (batch <= 0 || capacity <= 0)
    throw Error("LlamaModel::new_decode_cache: batch and capacity must be positive, got " +
                std::to_string(batch) + " and " + std::to_string(capacity));
  DecodeCache c;
  const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  c.layers.resize(layers_.size());
  for (auto& l : c.layers) {
    l.k = at::zeros({batch, cfg_.num_key_value_heads, capacity, cfg_.head_dim}, opts);
    l.v = at::zeros({batch, cfg_.num_key_value_heads, capacity, cfg_.head_dim}, opts);
    l.len = 0;
  }
  c.valid = at::zeros({batch, capacity}, at::TensorOptions().dtype(at::kBool).device(device_));
  c.key_bias = at::zeros({batch, capacity}, opts);
  c.no_padding = no_padding;
  // Not for a small head (oneDNN's per-call cost outweighs it there: 28 vs 23 us for 16 x 128 x
  // 384, docs/performance.md), nor where the skinny GEMM takes the head (batch <= kSkinnyMaxRows:
  // 1.2-1.4x faster steps than oneDNN's head at batch 8, "CPU decode with the skinny GEMM").
  const double head_flops = 2.0 * static_cast<double>(batch) *
                            static_cast<double>(cfg_.hidden_size) *
                            static_cast<double>(cfg_.vocab_size);
  const bool skinny_head = skinny_gemm_enabled() && batch <= kSkinnyMaxRows;
  if (batch >= 2 && head_flops >= kSerialProductFlops && device_.is_cpu() && dtype_ == at::kFloat &&
      !skinny_head && onednn_head_enabled())
    c.head_reordered = onednn_reorder_linear_weight(lm_head_weight(), batch);
  return c;
}

at::Tensor LlamaModel::decode(const at::Tensor& input_ids, const at::Tensor& position_ids,
                              const at::Tensor& valid, DecodeCache& c, bool last_only) const {
  check_tokens(input_ids, "input_ids", {});
  check_tokens(position_ids, "position_ids", input_ids.sizes());
  const int64_t b = input_ids.size(0), t = input_ids.size(1), total = c.len + t;
  if (!c.valid.defined() || c.valid.size(0) != b || c.layers.size() != layers_.size())
    throw Error(
        "LlamaModel::decode: the cache was made for another batch or model (new_decode_cache)");
  if (!valid.defined() || valid.sizes() != input_ids.sizes() || valid.scalar_type() != at::kBool)
    throw Error("LlamaModel::decode: valid must be a bool tensor shaped like input_ids, got " +
                describe(valid));
  if (total > c.capacity())
    throw Error("LlamaModel::decode: the cache holds " + std::to_string(c.capacity()) +
                " positions, " + std::to_string(total) + " asked");
  at::NoGradGuard no_grad;
  c.valid.narrow(1, c.len, t).copy_(valid);
  at::Tensor bias_col;  // this call's key_bias columns, set after the layers ran
  if (c.key_bias.defined() && !c.no_padding) {
    bias_col = c.key_bias.narrow(1, c.len, t);
    bias_col.zero_();  // a one-token query attends to itself (valid or not)
  }
  CacheMasks m;
  if (t == 1 && c.len > 0) {
    // One new token per row: every filled position is at or before it, so causality needs no
    // mask; padding is key_bias (a view, nothing built); a sliding layer narrows both to its
    // window (decoder_layer).
    if (!c.no_padding) m.full = c.key_bias.narrow(1, 0, total).view({b, 1, 1, total});
  } else if (c.no_padding && c.len == 0 && (cfg_.sliding_window <= 0 || t <= cfg_.sliding_window)) {
    // A prefill without padding within every window: plain causal attention (no mask).
  } else {
    const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device_);
    const at::Tensor q = at::arange(c.len, total, long_opts).unsqueeze(1);  // [T, 1] query slots
    const at::Tensor j = at::arange(total, long_opts).unsqueeze(0);         // [1, total] key slots
    const at::Tensor keys = c.valid.narrow(1, 0, total).unsqueeze(1);       // [B, 1, total]
    // Padding attends to itself only (a row with no key would give NaN that spreads through v).
    m.full = j.le(q)
                 .unsqueeze(0)
                 .logical_and(keys)
                 .logical_or(j.eq(q).unsqueeze(0))
                 .unsqueeze(1);  // [B, 1, T, total]
    if (cfg_.sliding_window > 0)
      m.window = m.full.logical_and((q - j).lt(cfg_.sliding_window).view({1, 1, t, total}));
  }
  at::Tensor h = head_begin(hidden_impl(input_ids, position_ids, false, nullptr, &c.layers, &m));
  if (bias_col.defined())  // later queries never see padding
    bias_col.masked_fill_(valid.logical_not().to(bias_col.device()),
                          -std::numeric_limits<double>::infinity());
  c.len = total;
  if (last_only) h = h.select(1, t - 1);
  if (last_only && c.head_reordered.defined())
    return head_end(onednn_linear(h.contiguous(), c.head_reordered)).to(at::kFloat);
  return head_end(decode_linear(h, lm_head_weight())).to(at::kFloat);
}

at::Tensor LlamaModel::decode_step(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                   const at::Tensor& slot, DecodeCache& c) const {
  check_tokens(input_ids, "input_ids", {});
  check_tokens(position_ids, "position_ids", input_ids.sizes());
  const int64_t b = input_ids.size(0), cap = c.capacity();
  if (input_ids.size(1) != 1)
    throw Error("LlamaModel::decode_step: one token per row, got input_ids " + describe(input_ids));
  if (!slot.defined() || slot.dim() != 1 || slot.numel() != 1 || slot.scalar_type() != at::kLong ||
      slot.device() != device_)
    throw Error("LlamaModel::decode_step: slot must be an int64 [1] tensor on " + device_.str() +
                ", got " + describe(slot));
  if (!c.valid.defined() || c.valid.size(0) != b || c.layers.size() != layers_.size())
    throw Error(
        "LlamaModel::decode_step: the cache was made for another batch or model "
        "(new_decode_cache)");
  if (c.len <= 0)
    throw Error("LlamaModel::decode_step: the cache is empty (prefill it with decode)");
  at::NoGradGuard no_grad;
  c.valid.index_fill_(1, slot, true);
  // The key bias: 0 where a slot holds a real token, -inf elsewhere; a sliding layer's also hides
  // the slots at or before slot - window. [B, 1, 1, capacity], broadcast over heads and queries.
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const auto bias_opts = at::TensorOptions().dtype(dtype_).device(device_);
  const at::Tensor visible = c.valid.view({b, 1, 1, cap});
  CacheMasks m;
  m.full = at::full({b, 1, 1, cap}, neg_inf, bias_opts).masked_fill_(visible, 0.0);
  if (cfg_.sliding_window > 0) {
    const at::Tensor inside = at::arange(cap, at::TensorOptions().dtype(at::kLong).device(device_))
                                  .gt(slot - cfg_.sliding_window)
                                  .view({1, 1, 1, cap});
    m.window =
        at::full({b, 1, 1, cap}, neg_inf, bias_opts).masked_fill_(visible.logical_and(inside), 0.0);
  }
  struct Slots {  // every layer's cache writes at `slot` for this call only
    std::vector<KVCacheLayer>& layers;
    ~Slots() {
      for (auto& l : layers) l.slot = at::Tensor();
    }
  } slots{c.layers};
  for (auto& l : c.layers) l.slot = slot;
  at::Tensor h = head_begin(hidden_impl(input_ids, position_ids, false, nullptr, &c.layers, &m));
  return head_end(decode_linear(h.select(1, 0), lm_head_weight())).to(at::kFloat);
}

}  // namespace ciuic::model
