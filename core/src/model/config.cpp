// LlamaConfig: HF config.json parsing (both rope forms), validation, writing.
#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>

#include "base/paths.h"

namespace ciuic::model {

using nlohmann::json;

const char* rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault: return "default";
    case RopeType::kLinear: return "linear";
    case RopeType::kLlama3: return "llama3";
  }
  return "?";
}

namespace {

std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

[[noreturn]] void bad_key(const std::string& origin, const std::string& key,
                          const std::string& what) {
  throw Error(origin + ": key `" + key + "`: " + what);
}

// Typed readers. A key that is absent or null leaves `out` unchanged (HF treats None as "use the
// default"); a value of the wrong type is an error naming the key.
template <class T>
bool read_number(const json& j, const char* key, const std::string& prefix,
                 const std::string& origin, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  constexpr bool integral = std::is_integral_v<T>;
  if (integral ? !it->is_number_integer() : !it->is_number())
    bad_key(origin, prefix + key,
            std::string(integral ? "expected an integer" : "expected a number") + ", found " +
                shown(*it));
  out = it->get<T>();
  return true;
}
bool read_int(const json& j, const char* key, const std::string& prefix, const std::string& origin,
              int64_t& out) {
  return read_number(j, key, prefix, origin, out);
}
bool read_float(const json& j, const char* key, const std::string& prefix,
                const std::string& origin, double& out) {
  return read_number(j, key, prefix, origin, out);
}
void read_bool(const json& j, const char* key, const std::string& origin, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_boolean()) bad_key(origin, key, "expected true or false, found " + shown(*it));
  out = it->get<bool>();
}
std::optional<std::string> read_string(const json& j, const char* key, const std::string& prefix,
                                       const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) bad_key(origin, prefix + key, "expected a string, found " + shown(*it));
  return it->get<std::string>();
}
void read_token_id(const json& j, const char* key, const std::string& origin,
                   std::optional<int64_t>& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (it->is_null()) {
    out.reset();
    return;
  }
  if (!it->is_number_integer())
    bad_key(origin, key, "expected an integer token id or null, found " + shown(*it));
  out = it->get<int64_t>();
}

// Rope settings from either `rope_scaling` (+ top-level rope_theta) or `rope_parameters`.
void read_rope_dict(const json& d, const std::string& key, const std::string& origin,
                    LlamaConfig& c) {
  if (!d.is_object()) bad_key(origin, key, "expected an object or null, found " + shown(d));
  // transformers >= 5 may nest one dict per layer type ({"full_attention": {...}, ...}).
  for (const auto& [k, v] : d.items())
    if (v.is_object())
      bad_key(
          origin, key + "." + k,
          "per-layer-type rope parameters are not supported (Llama uses one rope for all layers)");
  const std::string prefix = key + ".";
  std::optional<std::string> type = read_string(d, "rope_type", prefix, origin);
  std::string type_key = prefix + "rope_type";
  if (!type) {
    type = read_string(d, "type", prefix, origin);
    type_key = prefix + "type";
  }
  read_float(d, "rope_theta", prefix, origin, c.rope_theta);
  double partial = 1.0;
  if (read_float(d, "partial_rotary_factor", prefix, origin, partial) && partial != 1.0)
    bad_key(origin, prefix + "partial_rotary_factor",
            "partial rotary embeddings are not supported (found " +
                shown(d["partial_rotary_factor"]) + ", expected 1.0)");
  const std::string t = type.value_or("default");
  if (t == "default") {
    c.rope_type = RopeType::kDefault;
    c.rope_scaling_factor = 1.0;
  } else if (t == "linear" || t == "llama3") {
    c.rope_type = t == "linear" ? RopeType::kLinear : RopeType::kLlama3;
    if (!read_float(d, "factor", prefix, origin, c.rope_scaling_factor))
      bad_key(origin, prefix + "factor", "missing: rope type \"" + t + "\" needs a scaling factor");
    if (c.rope_type == RopeType::kLlama3) {
      if (!read_float(d, "low_freq_factor", prefix, origin, c.rope_low_freq_factor))
        bad_key(origin, prefix + "low_freq_factor", "missing: rope type \"llama3\" needs it");
      if (!read_float(d, "high_freq_factor", prefix, origin, c.rope_high_freq_factor))
        bad_key(origin, prefix + "high_freq_factor", "missing: rope type \"llama3\" needs it");
      read_int(d, "original_max_position_embeddings", prefix, origin,
               c.rope_original_max_position_embeddings);
    }
  } else {
    bad_key(origin, type_key,
            "rope type \"" + t +
                "\" is not supported (supported: \"default\", \"linear\", \"llama3\")");
  }
}

struct FamilyName {
  const char* model_type;
  const char* architecture;
  ModelFamily family;
};
constexpr FamilyName kFamilies[] = {{"llama", "LlamaForCausalLM", ModelFamily::kLlama},
                                    {"mistral", "MistralForCausalLM", ModelFamily::kMistral},
                                    {"qwen2", "Qwen2ForCausalLM", ModelFamily::kQwen2},
                                    {"qwen3", "Qwen3ForCausalLM", ModelFamily::kQwen3},
                                    {"gemma3_text", "Gemma3ForCausalLM", ModelFamily::kGemma3Text}};

const FamilyName& family_entry(ModelFamily f) {
  for (const auto& e : kFamilies)
    if (e.family == f) return e;
  return kFamilies[0];
}

bool is_qwen(ModelFamily f) { return f == ModelFamily::kQwen2 || f == ModelFamily::kQwen3; }

constexpr const char* kFull = "full_attention";
constexpr const char* kSliding = "sliding_attention";

// `layer_types`: one "full_attention" / "sliding_attention" per layer; true = sliding.
std::vector<uint8_t> read_layer_types(const json& v, int64_t layers, const std::string& origin) {
  if (!v.is_array())
    bad_key(origin, "layer_types",
            "expected a list of \"full_attention\" / \"sliding_attention\", found " + shown(v));
  if (static_cast<int64_t>(v.size()) != layers)
    bad_key(origin, "layer_types",
            "has " + std::to_string(v.size()) + " entries, num_hidden_layers is " +
                std::to_string(layers));
  std::vector<uint8_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    if (e == kFull)
      out.push_back(0);
    else if (e == kSliding)
      out.push_back(1);
    else
      bad_key(origin, "layer_types[" + std::to_string(i) + "]",
              "expected \"full_attention\" or \"sliding_attention\", found " + shown(e));
  }
  return out;
}

// Gemma's pattern: every `pattern`-th layer is full, the others slide (transformers' rule).
std::vector<uint8_t> pattern_layers(int64_t layers, int64_t pattern) {
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < layers; ++i) out.push_back((i + 1) % pattern != 0 ? 1 : 0);
  return out;
}

void refuse_true(const json& j, const char* key, const std::string& origin,
                 const std::string& why) {
  bool on = false;
  read_bool(j, key, origin, on);
  if (on) bad_key(origin, key, why + " (expected false)");
}

void refuse_non_null(const json& j, const char* key, const std::string& origin,
                     const std::string& why) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null())
    bad_key(origin, key, why + " (expected null, found " + shown(*it) + ")");
}

void parse_into(const json& j, const std::string& origin, LlamaConfig& c) {
  if (!j.is_object())
    throw Error(origin + ": expected a JSON object at the top level, found " + shown(j));
  ModelFamily family = ModelFamily::kLlama;
  if (auto mt = read_string(j, "model_type", "", origin)) {
    const FamilyName* found = nullptr;
    for (const auto& e : kFamilies)
      if (*mt == e.model_type) found = &e;
    if (!found)
      bad_key(origin, "model_type",
              "model type \"" + *mt + "\" is not supported (supported: " + supported_model_types() +
                  ")" +
                  (*mt == "gemma3" ? "; for Gemma 3's multimodal checkpoints use a text-only "
                                     "(\"gemma3_text\") model"
                                   : ""));
    family = found->family;
  }
  c = LlamaConfig::defaults(family);
  const bool gemma = family == ModelFamily::kGemma3Text;
  const std::string fam = std::string("model type \"") + model_type_name(family) + "\"";
  if (gemma) {
    if (auto act = read_string(j, "hidden_activation", "", origin);
        act && *act != "gelu_pytorch_tanh")
      bad_key(origin, "hidden_activation",
              "activation \"" + *act + "\" is not supported for " + fam +
                  " (expected \"gelu_pytorch_tanh\")");
    refuse_non_null(j, "final_logit_softcapping", origin, "logit soft-capping is not supported");
    refuse_non_null(j, "attn_logit_softcapping", origin, "attention soft-capping is not supported");
    refuse_true(j, "use_bidirectional_attention", origin,
                "bidirectional attention is not supported");
  } else if (auto act = read_string(j, "hidden_act", "", origin); act && *act != "silu") {
    bad_key(origin, "hidden_act",
            "activation \"" + *act + "\" is not supported for " + fam + " (expected \"silu\")");
  }
  // attention_bias: the Llama, Qwen3 and Gemma 3 classes read it (q/k/v/o biases); Mistral's and
  // Qwen2's ignore it (Qwen2 always has q/k/v biases). mlp_bias: Llama only.
  if (family == ModelFamily::kLlama || family == ModelFamily::kQwen3 || gemma)
    refuse_true(j, "attention_bias", origin,
                "biases on the attention projections are not supported for " + fam);
  if (family == ModelFamily::kLlama)
    refuse_true(j, "mlp_bias", origin, "biases in the MLP are not supported");
  read_int(j, "vocab_size", "", origin, c.vocab_size);
  read_int(j, "hidden_size", "", origin, c.hidden_size);
  read_int(j, "intermediate_size", "", origin, c.intermediate_size);
  read_int(j, "num_hidden_layers", "", origin, c.num_hidden_layers);
  bool heads_given = read_int(j, "num_attention_heads", "", origin, c.num_attention_heads);
  bool kv_given = read_int(j, "num_key_value_heads", "", origin, c.num_key_value_heads);
  // Only LlamaConfig defaults the KV heads to the query heads; the others have fixed defaults.
  if (heads_given && !kv_given && family == ModelFamily::kLlama)
    c.num_key_value_heads = c.num_attention_heads;
  // Qwen3 and Gemma 3 default to a fixed head_dim; the others to hidden_size / heads.
  const bool head_dim_given = read_int(j, "head_dim", "", origin, c.head_dim);
  if (!head_dim_given && family != ModelFamily::kQwen3 && !gemma && c.num_attention_heads > 0)
    c.head_dim = c.hidden_size / c.num_attention_heads;
  read_int(j, "max_position_embeddings", "", origin, c.max_position_embeddings);
  read_float(j, "rms_norm_eps", "", origin, c.rms_norm_eps);
  read_float(j, "initializer_range", "", origin, c.initializer_range);
  read_bool(j, "tie_word_embeddings", origin, c.tie_word_embeddings);
  read_token_id(j, "bos_token_id", origin, c.bos_token_id);
  read_token_id(j, "pad_token_id", origin, c.pad_token_id);
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    c.eos_token_ids.clear();
    if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer())
          bad_key(origin, "eos_token_id", "expected integer token ids, found " + shown(*it));
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else if (!it->is_null()) {
      if (!it->is_number_integer())
        bad_key(origin, "eos_token_id",
                "expected an integer token id, a list of them or null, found " + shown(*it));
      c.eos_token_ids.push_back(it->get<int64_t>());
    }
  }
  c.eos_token_id =
      c.eos_token_ids.empty() ? std::nullopt : std::optional<int64_t>(c.eos_token_ids[0]);
  if (auto d = read_string(j, "torch_dtype", "", origin)) c.torch_dtype = *d;
  if (auto d = j.find("dtype"); d != j.end() && d->is_string())
    c.torch_dtype = d->get<std::string>();

  // Sliding windows. A window of null leaves every layer on full attention.
  auto read_window = [&](int64_t fallback) {
    int64_t w = fallback;
    auto it = j.find("sliding_window");
    if (it != j.end()) {
      if (it->is_null()) return int64_t{0};
      if (!it->is_number_integer() || it->get<int64_t>() <= 0)
        bad_key(origin, "sliding_window",
                "expected a positive integer or null, found " + shown(*it));
      w = it->get<int64_t>();
    }
    return w;
  };
  const int64_t layers = std::max<int64_t>(c.num_hidden_layers, 0);
  auto layer_types = j.find("layer_types");
  const bool types_given = layer_types != j.end() && !layer_types->is_null();
  if (family == ModelFamily::kMistral) {
    // MistralAttention windows every layer (transformers warns about, and ignores, layer_types).
    c.sliding_window = read_window(4096);
    c.sliding_layers.assign(static_cast<size_t>(layers), c.sliding_window > 0 ? 1 : 0);
  } else if (is_qwen(family)) {
    bool use = false;
    read_bool(j, "use_sliding_window", origin, use);
    read_int(j, "max_window_layers", "", origin, c.max_window_layers);
    const int64_t w = read_window(4096);
    c.sliding_window = use ? w : 0;
    std::vector<uint8_t> types;
    if (types_given) {
      types = read_layer_types(*layer_types, layers, origin);
    } else {
      for (int64_t i = 0; i < layers; ++i)
        types.push_back(c.sliding_window > 0 && i >= c.max_window_layers ? 1 : 0);
    }
    for (auto& t : types) t = t && c.sliding_window > 0 ? 1 : 0;
    c.sliding_layers = types;
  } else if (gemma) {
    c.sliding_window = read_window(4096);
    read_int(j, "sliding_window_pattern", "", origin, c.sliding_window_pattern);
    if (types_given) {
      c.sliding_layers = read_layer_types(*layer_types, layers, origin);
      // Remember the pattern when the list follows one (with_overrides may change the layer count).
      int64_t p = 0;
      for (int64_t cand = 1; cand <= layers + 1 && p == 0; ++cand)
        if (pattern_layers(layers, cand) == c.sliding_layers) p = cand;
      c.sliding_window_pattern = p;
    } else {
      if (c.sliding_window_pattern <= 0)
        bad_key(origin, "sliding_window_pattern",
                "expected a positive integer, found " + std::to_string(c.sliding_window_pattern));
      c.sliding_layers = pattern_layers(layers, c.sliding_window_pattern);
    }
    if (c.sliding_window == 0) std::fill(c.sliding_layers.begin(), c.sliding_layers.end(), 0);
    read_float(j, "query_pre_attn_scalar", "", origin, c.query_pre_attn_scalar);
    read_float(j, "rope_local_base_freq", "", origin, c.rope_local_theta);
  }

  // Rope: top-level rope_theta first (old form), then whichever dict is present. When both dicts
  // are written (as to_json does), rope_parameters wins, like transformers >= 5.
  read_float(j, "rope_theta", "", origin, c.rope_theta);
  double partial = 1.0;
  if (read_float(j, "partial_rotary_factor", "", origin, partial) && partial != 1.0)
    bad_key(origin, "partial_rotary_factor",
            "partial rotary embeddings are not supported (expected 1.0)");
  auto rp = j.find("rope_parameters");
  auto rs = j.find("rope_scaling");
  if (gemma && rp != j.end() && !rp->is_null()) {
    // One dict per layer type; the sliding layers' must be the default rope.
    if (!rp->is_object())
      bad_key(origin, "rope_parameters", "expected an object or null, found " + shown(*rp));
    for (const auto& [k, v] : rp->items())
      if (k != kFull && k != kSliding)
        bad_key(
            origin, "rope_parameters." + k,
            "expected one rope dict per layer type (\"full_attention\", \"sliding_attention\")");
    if (auto f = rp->find(kFull); f != rp->end() && !f->is_null())
      read_rope_dict(*f, std::string("rope_parameters.") + kFull, origin, c);
    if (auto sl = rp->find(kSliding); sl != rp->end() && !sl->is_null()) {
      LlamaConfig local;
      local.rope_theta = c.rope_local_theta;
      read_rope_dict(*sl, std::string("rope_parameters.") + kSliding, origin, local);
      if (local.rope_type != RopeType::kDefault)
        bad_key(origin, std::string("rope_parameters.") + kSliding + ".rope_type",
                std::string("rope type \"") + rope_type_name(local.rope_type) +
                    "\" is not supported on the sliding layers (expected \"default\")");
      c.rope_local_theta = local.rope_theta;
    }
  } else if (rp != j.end() && !rp->is_null()) {
    read_rope_dict(*rp, "rope_parameters", origin, c);
  } else if (rs != j.end() && !rs->is_null()) {
    read_rope_dict(*rs, "rope_scaling", origin, c);
  }
}

}  // namespace

const char* model_type_name(ModelFamily f) { return family_entry(f).model_type; }

std::string supported_model_types() {
  std::string s;
  for (const auto& e : kFamilies)
    s += (s.empty() ? "\"" : ", \"") + std::string(e.model_type) + "\"";
  return s;
}

LlamaConfig LlamaConfig::defaults(ModelFamily f) {
  LlamaConfig c;  // transformers' LlamaConfig defaults
  c.family = f;
  switch (f) {
    case ModelFamily::kLlama: break;
    case ModelFamily::kMistral:
      c.intermediate_size = 14336;
      c.num_key_value_heads = 8;
      c.max_position_embeddings = 4096 * 32;
      c.sliding_window = 4096;
      break;
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3:
      c.vocab_size = 151936;
      c.intermediate_size = 22016;
      c.max_position_embeddings = 32768;
      c.bos_token_id.reset();
      c.eos_token_id.reset();
      c.eos_token_ids.clear();
      c.max_window_layers = 28;
      c.qkv_bias = f == ModelFamily::kQwen2;
      c.qk_norm = f == ModelFamily::kQwen3;
      break;
    case ModelFamily::kGemma3Text:
      c.vocab_size = 262208;
      c.hidden_size = 2304;
      c.intermediate_size = 9216;
      c.num_hidden_layers = 26;
      c.num_attention_heads = 8;
      c.num_key_value_heads = 4;
      c.head_dim = 256;
      c.max_position_embeddings = 131072;
      c.pad_token_id = 0;
      c.eos_token_id = 1;
      c.eos_token_ids = {1};
      c.bos_token_id = 2;
      c.tie_word_embeddings = true;
      c.rope_theta = 1'000'000.0;
      c.rope_local_theta = 10'000.0;
      c.query_pre_attn_scalar = 256;
      c.sliding_window = 4096;
      c.sliding_window_pattern = 6;
      c.hidden_act = Activation::kGeluTanh;
      c.qk_norm = true;
      c.gemma_norm = true;
      c.sandwich_norms = true;
      c.scale_embeddings = true;
      c.local_rope = true;
      break;
  }
  return c;
}

void LlamaConfig::validate(const std::string& origin) const {
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) bad_key(origin, key, "expected a positive integer, found " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("max_position_embeddings", max_position_embeddings);
  // Sizes a tensor can have: every dimension within int32 (the kernels index with it), and a
  // parameter count (computed in double, so it cannot overflow) below 2^40 (about 1.1 trillion),
  // beyond any model a few GPUs fine-tune. Otherwise `num_hidden_layers = 1e9` or
  // `vocab_size = 2^62` ends in std::bad_alloc or a storage-size overflow deep inside LibTorch.
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
  for (auto [key, v] :
       {std::pair{"vocab_size", vocab_size}, std::pair{"hidden_size", hidden_size},
        std::pair{"intermediate_size", intermediate_size},
        std::pair{"num_hidden_layers", num_hidden_layers},
        std::pair{"num_attention_heads", num_attention_heads},
        std::pair{"num_key_value_heads", num_key_value_heads}, std::pair{"head_dim", head_dim},
        std::pair{"max_position_embeddings", max_position_embeddings}})
    if (v > kMaxDim) bad_key(origin, key, std::to_string(v) + " is larger than 2^31 - 1");
  const double h = static_cast<double>(hidden_size),
               q = static_cast<double>(num_attention_heads) * head_dim,
               kv = static_cast<double>(num_key_value_heads) * head_dim;
  const double per_layer =
      h * (q + 2 * kv) + q * h + 3 * h * static_cast<double>(intermediate_size) + 2 * h;
  const double params =
      static_cast<double>(num_hidden_layers) * per_layer + 2 * static_cast<double>(vocab_size) * h;
  if (params >= std::ldexp(1.0, 40))
    bad_key(origin, "num_hidden_layers",
            "this shape has about " + std::to_string(static_cast<int64_t>(params / 1e9)) +
                " billion parameters, more than 2^40: check num_hidden_layers, hidden_size, "
                "intermediate_size and vocab_size");
  if (num_attention_heads % num_key_value_heads != 0)
    bad_key(origin, "num_key_value_heads",
            "num_attention_heads (" + std::to_string(num_attention_heads) +
                ") must be a multiple of it (" + std::to_string(num_key_value_heads) + ")");
  if (head_dim % 2 != 0)
    bad_key(origin, "head_dim",
            "rotary embeddings need an even head dimension, found " + std::to_string(head_dim));
  if (!(rope_theta > 0) || !std::isfinite(rope_theta))
    bad_key(origin, "rope_theta",
            "expected a positive number, found " + std::to_string(rope_theta));
  if (!(rms_norm_eps > 0)) bad_key(origin, "rms_norm_eps", "expected a positive number");
  if (!(rope_scaling_factor > 0) || !std::isfinite(rope_scaling_factor))
    bad_key(origin, "rope_scaling.factor",
            "expected a positive number, found " + std::to_string(rope_scaling_factor));
  if (rope_type == RopeType::kLlama3 && !(rope_high_freq_factor > rope_low_freq_factor))
    bad_key(origin, "rope_scaling.high_freq_factor", "must be greater than low_freq_factor");
  if (bos_token_id && (*bos_token_id < 0 || *bos_token_id >= vocab_size))
    bad_key(origin, "bos_token_id",
            std::to_string(*bos_token_id) + " is outside the vocabulary [0, " +
                std::to_string(vocab_size) + ")");
  // torch.nn.Embedding's padding_idx: [-vocab_size, vocab_size), negative counting from the end.
  if (pad_token_id && (*pad_token_id < -vocab_size || *pad_token_id >= vocab_size))
    bad_key(origin, "pad_token_id",
            std::to_string(*pad_token_id) + " is outside the vocabulary [-" +
                std::to_string(vocab_size) + ", " + std::to_string(vocab_size) +
                ") (a negative id counts from the end)");
  if (sliding_window < 0) bad_key(origin, "sliding_window", "expected a positive integer or null");
  if (!sliding_layers.empty() && static_cast<int64_t>(sliding_layers.size()) != num_hidden_layers)
    bad_key(origin, "layer_types",
            "has " + std::to_string(sliding_layers.size()) + " entries, num_hidden_layers is " +
                std::to_string(num_hidden_layers));
  if (query_pre_attn_scalar < 0 || !std::isfinite(query_pre_attn_scalar))
    bad_key(origin, "query_pre_attn_scalar", "expected a positive number");
  if (!(rope_local_theta > 0) || !std::isfinite(rope_local_theta))
    bad_key(origin, "rope_local_base_freq", "expected a positive number");
  for (int64_t e : eos_token_ids)
    if (e < 0 || e >= vocab_size)
      bad_key(
          origin, "eos_token_id",
          std::to_string(e) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
}

LlamaConfig LlamaConfig::from_json(const json& j, const std::string& origin) {
  LlamaConfig c;
  parse_into(j, origin, c);
  c.validate(origin);
  return c;
}

LlamaConfig LlamaConfig::from_file(const std::string& path) {
  if (const std::string why = paths::problem(path, paths::Want::kAny); !why.empty())
    throw Error(path + ": cannot open the model config (expected an HF config.json): " + why);
  // A regular file of at most kMaxJsonInputBytes: /dev/zero or a FIFO is refused at once.
  const std::string text = read_input(path, "model config (an HF config.json)", kMaxJsonInputBytes);
  check_json_depth(text, path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range (a number that overflows)
    throw Error(path + ": malformed JSON: " + e.what());
  }
  return from_json(j, path);
}

LlamaConfig LlamaConfig::with_overrides(const json& overrides, const std::string& origin) const {
  if (!overrides.is_object()) throw Error(origin + ": expected a table of config keys");
  json j = to_json();
  json o = overrides;
  // Another model_type starts from that family's defaults (its keys, not this family's).
  if (auto mt = o.find("model_type");
      mt != o.end() && mt->is_string() && *mt != model_type_name(family)) {
    LlamaConfig probe;
    parse_into(json{{"model_type", *mt}}, origin, probe);  // refuses an unknown type by name
    j = LlamaConfig::defaults(probe.family).to_json();
  }
  // A new layer count re-derives the layer types (from sliding_window_pattern / max_window_layers).
  if (o.contains("num_hidden_layers") && !o.contains("layer_types")) {
    if (family == ModelFamily::kGemma3Text && sliding_window_pattern == 0 &&
        !o.contains("sliding_window_pattern") && j.contains("layer_types"))
      bad_key(origin, "num_hidden_layers",
              "the model's layer_types follow no sliding_window_pattern: give layer_types for the "
              "new layer count");
    j.erase("layer_types");
  }
  // The recipe's flat rope keys become an HF rope_scaling dict.
  if (o.contains("rope_scaling_type") || o.contains("rope_scaling_factor")) {
    std::string type = rope_type_name(rope_type);
    if (auto t = read_string(o, "rope_scaling_type", "", origin))
      type = *t == "none" ? "default" : *t;
    if (type != "default" && type != "linear")
      bad_key(origin, "rope_scaling_type",
              "expected \"none\" or \"linear\", found \"" + type + "\"");
    double factor = rope_scaling_factor;
    read_float(o, "rope_scaling_factor", "", origin, factor);
    o.erase("rope_scaling_type");
    o.erase("rope_scaling_factor");
    o["rope_scaling"] =
        type == "default" ? json(nullptr) : json{{"type", type}, {"factor", factor}};
  }
  // A rope dict in the overrides replaces the base's rope scaling entirely.
  if (o.contains("rope_scaling") || o.contains("rope_parameters")) {
    j.erase("rope_scaling");
    j.erase("rope_parameters");
  }
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    json& rp = j["rope_parameters"];
    const bool per_type = rp.contains(kFull);  // gemma3_text: one dict per layer type
    if (o.contains("rope_theta")) (per_type ? rp[kFull] : rp)["rope_theta"] = o["rope_theta"];
    if (per_type && o.contains("rope_local_base_freq"))
      rp[kSliding]["rope_theta"] = o["rope_local_base_freq"];
  }
  // head_dim follows hidden_size / heads unless given explicitly (or it differed in the base).
  if ((o.contains("hidden_size") || o.contains("num_attention_heads")) && !o.contains("head_dim") &&
      head_dim == hidden_size / num_attention_heads)
    j.erase("head_dim");
  if (o.contains("num_attention_heads") && !o.contains("num_key_value_heads") &&
      num_key_value_heads == num_attention_heads)
    j.erase("num_key_value_heads");
  for (const auto& [k, v] : o.items()) j[k] = v;
  return from_json(j, origin);
}

json LlamaConfig::to_json() const {
  json j;
  const FamilyName& fam = family_entry(family);
  const bool gemma = family == ModelFamily::kGemma3Text;
  j["architectures"] = json::array({fam.architecture});
  j["model_type"] = fam.model_type;
  if (gemma)
    j["hidden_activation"] = "gelu_pytorch_tanh";
  else
    j["hidden_act"] = "silu";
  if (family == ModelFamily::kLlama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  if (family == ModelFamily::kQwen3 || gemma) j["attention_bias"] = false;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["tie_word_embeddings"] = tie_word_embeddings;
  auto types = [&] {
    json t = json::array();
    for (int64_t i = 0; i < num_hidden_layers; ++i) t.push_back(layer_slides(i) ? kSliding : kFull);
    return t;
  };
  const json window = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  if (family == ModelFamily::kMistral) j["sliding_window"] = window;
  if (is_qwen(family)) {
    j["use_sliding_window"] = sliding_window > 0;
    j["sliding_window"] = window;
    j["max_window_layers"] = max_window_layers;
    j["layer_types"] = types();
  }
  if (gemma) {
    j["sliding_window"] = window;
    if (sliding_window_pattern > 0) j["sliding_window_pattern"] = sliding_window_pattern;
    j["layer_types"] = types();
    // transformers' Gemma3TextConfig types it int (a float is refused); keep a fraction as is.
    if (query_pre_attn_scalar == std::floor(query_pre_attn_scalar) && query_pre_attn_scalar < 1e15)
      j["query_pre_attn_scalar"] = static_cast<int64_t>(query_pre_attn_scalar);
    else
      j["query_pre_attn_scalar"] = query_pre_attn_scalar;
    j["final_logit_softcapping"] = nullptr;
    j["attn_logit_softcapping"] = nullptr;
    j["rope_local_base_freq"] = rope_local_theta;
  }
  j["rope_theta"] = rope_theta;
  json scaling = nullptr;
  json params = {{"rope_type", rope_type_name(rope_type)}, {"rope_theta", rope_theta}};
  if (rope_type != RopeType::kDefault) {
    scaling = {{"type", rope_type_name(rope_type)},
               {"rope_type", rope_type_name(rope_type)},
               {"factor", rope_scaling_factor}};
    if (rope_type == RopeType::kLlama3) {
      scaling["low_freq_factor"] = rope_low_freq_factor;
      scaling["high_freq_factor"] = rope_high_freq_factor;
      if (rope_original_max_position_embeddings > 0)
        scaling["original_max_position_embeddings"] = rope_original_max_position_embeddings;
    }
    for (const auto& [k, v] : scaling.items())
      if (k != "type") params[k] = v;
  }
  j["rope_scaling"] = scaling;
  if (gemma)
    j["rope_parameters"] = {
        {kFull, params}, {kSliding, {{"rope_type", "default"}, {"rope_theta", rope_local_theta}}}};
  else
    j["rope_parameters"] = params;
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  if (eos_token_ids.size() > 1)
    j["eos_token_id"] = eos_token_ids;
  else
    j["eos_token_id"] = eos_token_id ? json(*eos_token_id) : json(nullptr);
  j["pad_token_id"] = pad_token_id ? json(*pad_token_id) : json(nullptr);
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

json LlamaConfig::generation_json() const {
  json g;
  g["_from_model_config"] = true;
  if (bos_token_id) g["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() > 1)
    g["eos_token_id"] = eos_token_ids;
  else if (eos_token_id)
    g["eos_token_id"] = *eos_token_id;
  if (pad_token_id) g["pad_token_id"] = *pad_token_id;
  return g;
}

int64_t LlamaConfig::num_parameters(bool include_embeddings) const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim;
  int64_t per_layer = h * q + 2 * h * kv + q * h + 3 * h * intermediate_size + 2 * h;
  if (qkv_bias) per_layer += q + 2 * kv;
  if (qk_norm) per_layer += 2 * head_dim;
  if (sandwich_norms) per_layer += 2 * h;
  int64_t n = num_hidden_layers * per_layer + h;  // + final norm
  if (include_embeddings) n += vocab_size * h * (tie_word_embeddings ? 1 : 2);
  return n;
}

double LlamaConfig::flops_per_token(int64_t seq_len) const {
  const double n =
      static_cast<double>(num_parameters(false)) + static_cast<double>(vocab_size * hidden_size);
  return 6.0 * n + 12.0 * static_cast<double>(num_hidden_layers) *
                       static_cast<double>(num_attention_heads * head_dim) *
                       static_cast<double>(seq_len);
}

}  // namespace ciuic::model
