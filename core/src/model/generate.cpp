// Generation: transformers' logits processors and the prefill + decode loop over a KV cache.
#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>
#include <ciuic/log.h>

#include "model/llama.h"
#include "model/step_graph.h"

namespace ciuic::model {

namespace {

using json = nlohmann::json;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

json read_json_file(const std::string& path, const char* what) {
  const std::string text = read_input(path, what, kMaxJsonInputBytes);
  check_json_depth(text, path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
}

// The row's ids so far as transformers' input_ids has them (left padding, prompt, new tokens): its
// last `window` only, all StopStrings looks at.
std::vector<int32_t> row_tail(const std::vector<int64_t>& padded, int64_t row, int64_t longest,
                              const std::vector<int32_t>& fresh, size_t window) {
  std::vector<int32_t> out;
  const size_t from_prompt = window > fresh.size() ? window - fresh.size() : 0;
  const auto take =
      static_cast<int64_t>(std::min<size_t>(from_prompt, static_cast<size_t>(longest)));
  for (int64_t k = longest - take; k < longest; ++k)
    out.push_back(static_cast<int32_t>(padded[static_cast<size_t>(row * longest + k)]));
  out.insert(out.end(), fresh.end() - static_cast<std::ptrdiff_t>(std::min(window, fresh.size())),
             fresh.end());
  return out;
}

// The environment variable `name`, or "" when unset.
std::string env_of(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Whether the one-token steps run LlamaModel::decode_step (GenerateOptions::decode_step).
bool static_step_for(GenerateOptions::DecodeStep d, c10::Device dev) {
  if (d != GenerateOptions::DecodeStep::kAuto) return d == GenerateOptions::DecodeStep::kStatic;
  const std::string e = env_of("CIUIC_DECODE_STEP");
  if (e == "static") return true;
  if (e == "dynamic") return false;
  if (!e.empty()) throw Error("CIUIC_DECODE_STEP must be static or dynamic, got \"" + e + "\"");
  return dev.is_cuda();
}

}  // namespace

void SamplingParams::validate(const std::string& where) const {
  if (!(temperature > 0) || !std::isfinite(temperature))
    throw Error(where + ": temperature must be a positive number, got " + num(temperature));
  if (top_k < 0) throw Error(where + ": top_k must be >= 0 (0: off), got " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1))
    throw Error(where + ": top_p must be in (0, 1], got " + num(top_p));
  if (!(min_p >= 0 && min_p <= 1))
    throw Error(where + ": min_p must be in [0, 1], got " + num(min_p));
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    throw Error(where + ": repetition_penalty must be a positive number, got " +
                num(repetition_penalty));
}

at::Tensor process_logits(const at::Tensor& scores_in, const at::Tensor& seen,
                          const SamplingParams& p,
                          std::vector<std::pair<std::string, at::Tensor>>* steps) {
  at::Tensor scores = scores_in;
  auto record = [&](const char* name) {
    if (steps) steps->emplace_back(name, scores);
  };
  const int64_t vocab = scores.size(-1);
  if (p.repetition_penalty != 1.0) {
    // RepetitionPenaltyLogitsProcessor: ids >= vocab (none here) would be clamped to a pad column.
    const at::Tensor ids = seen.to(at::kLong).clamp_max(vocab);
    const at::Tensor padded = at::constant_pad_nd(scores, {0, 1}, 0);
    at::Tensor s = at::gather(padded, 1, ids);
    s = at::where(s < 0, s * p.repetition_penalty, s / p.repetition_penalty);
    scores = padded.scatter(1, ids, s).narrow(1, 0, vocab);
    record("repetition_penalty");
  }
  if (!p.do_sample) return scores;
  if (p.temperature != 1.0) {
    scores = scores / p.temperature;
    record("temperature");
  }
  if (p.top_k != 0) {
    const int64_t k = std::min<int64_t>(std::max<int64_t>(p.top_k, 1), vocab);
    const at::Tensor kth = std::get<0>(at::topk(scores, k)).narrow(-1, k - 1, 1);
    scores = scores.masked_fill(scores < kth, kNegInf);
    record("top_k");
  }
  if (p.top_p != 1.0) {
    auto [sorted, idx] = at::sort(scores, /*dim=*/-1, /*descending=*/false);
    at::Tensor cum = sorted.softmax(-1).cumsum(-1);
    at::Tensor remove = cum <= (1 - p.top_p);
    remove.narrow(-1, vocab - 1, 1).fill_(false);  // min_tokens_to_keep = 1
    remove = remove.scatter(1, idx, remove);
    scores = scores.masked_fill(remove, kNegInf);
    record("top_p");
  }
  if (p.min_p > 0) {
    const at::Tensor probs = scores.softmax(-1);
    const at::Tensor top = std::get<0>(probs.max(-1, /*keepdim=*/true));
    at::Tensor remove = probs < top * p.min_p;
    remove.scatter_(-1, std::get<1>(at::topk(probs, 1, -1)), false);
    scores = scores.masked_fill(remove, kNegInf);
    record("min_p");
  }
  return scores;
}

std::vector<int32_t> eos_ids_of_folder(const std::string& folder) {
  auto ids_of = [](const json& v, const std::string& path) {
    std::vector<int32_t> out;
    auto one = [&](const json& e) {
      if (!e.is_number_integer())
        throw Error(path + ": eos_token_id must be an integer or a list of integers");
      out.push_back(e.get<int32_t>());
    };
    if (v.is_array())
      for (const auto& e : v) one(e);
    else if (!v.is_null())
      one(v);
    return out;
  };
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::string path = (std::filesystem::path(folder) / name).string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;
    const json j = read_json_file(path, name);
    if (j.is_object() && j.contains("eos_token_id")) return ids_of(j["eos_token_id"], path);
  }
  return {};
}

SamplingParams sampling_of_folder(const std::string& folder, SamplingParams base) {
  const std::string path = (std::filesystem::path(folder) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return base;
  const json j = read_json_file(path, "generation_config.json");
  if (!j.is_object()) throw Error(path + ": expected a JSON object");
  auto number = [&](const char* key, double& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) throw Error(path + ": " + key + " must be a number");
    out = j[key].get<double>();
  };
  if (j.contains("do_sample") && j["do_sample"].is_boolean())
    base.do_sample = j["do_sample"].get<bool>();
  number("temperature", base.temperature);
  number("top_p", base.top_p);
  number("min_p", base.min_p);
  number("repetition_penalty", base.repetition_penalty);
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer()) throw Error(path + ": top_k must be an integer");
    base.top_k = j["top_k"].get<int64_t>();
  }
  base.validate(path);
  return base;
}

GenerateResult generate(const LlamaModel& model, const std::vector<std::vector<int32_t>>& prompts,
                        const GenerateOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const LlamaConfig& cfg = model.config();
  o.sampling.validate("generate");
  if (o.max_new_tokens < 0)
    throw Error("generate: max_new_tokens must be >= 0, got " + std::to_string(o.max_new_tokens));
  if (prompts.empty()) throw Error("generate: no prompts");
  const int64_t b = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      throw Error("generate: prompt " + std::to_string(i) + " is empty (need at least one token)");
    for (int32_t id : prompts[i])
      if (id < 0 || id >= cfg.vocab_size)
        throw Error("generate: prompt " + std::to_string(i) + " has token " + std::to_string(id) +
                    " outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[i].size()));
  }
  const int64_t context = cfg.max_position_embeddings;
  if (longest > context)
    throw Error("generate: a prompt of " + std::to_string(longest) +
                " tokens is longer than the model's context (" + std::to_string(context) +
                ", max_position_embeddings)");
  int32_t pad = 0;
  if (o.pad_id)
    pad = *o.pad_id;
  else if (cfg.padding_idx() >= 0)
    pad = static_cast<int32_t>(cfg.padding_idx());
  else if (!o.eos_ids.empty())
    pad = o.eos_ids[0];
  // Left padding, the mask and transformers' position ids (cumsum(mask) - 1, 1 on padding).
  std::vector<int64_t> ids(static_cast<size_t>(b * longest), pad);
  std::vector<uint8_t> valid(static_cast<size_t>(b * longest), 0);
  std::vector<int64_t> pos(static_cast<size_t>(b * longest), 1);
  std::vector<int64_t> next_pos(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    const auto& p = prompts[static_cast<size_t>(r)];
    const int64_t off = longest - static_cast<int64_t>(p.size());
    for (size_t k = 0; k < p.size(); ++k) {
      const size_t at = static_cast<size_t>(r * longest + off) + k;
      ids[at] = p[k];
      valid[at] = 1;
      pos[at] = static_cast<int64_t>(k);
    }
    next_pos[static_cast<size_t>(r)] = static_cast<int64_t>(p.size());
  }
  at::NoGradGuard no_grad;
  const c10::Device dev = model.device();
  const auto cpu_long = at::TensorOptions().dtype(at::kLong);
  at::Tensor in_ids = at::tensor(ids, cpu_long).view({b, longest});
  at::Tensor in_pos = at::tensor(pos, cpu_long).view({b, longest});
  at::Tensor in_valid = at::tensor(std::vector<int64_t>(valid.begin(), valid.end()), cpu_long)
                            .view({b, longest})
                            .ne(0);
  const int64_t max_new = std::min(o.max_new_tokens, context - longest);
  GenerateResult res;
  res.tokens.resize(static_cast<size_t>(b));
  res.hit_eos.assign(static_cast<size_t>(b), false);
  res.hit_stop.assign(static_cast<size_t>(b), false);
  if (o.stop_strings.size() > 1 && o.stop_strings.size() != prompts.size())
    throw Error("generate: stop_strings has " + std::to_string(o.stop_strings.size()) +
                " entries for " + std::to_string(prompts.size()) +
                " prompts (give 0, 1 or one each)");
  auto stop_of = [&](size_t r) -> const StopStrings* {
    if (o.stop_strings.empty()) return nullptr;
    return o.stop_strings[o.stop_strings.size() == 1 ? 0 : r].get();
  };
  if (max_new <= 0) {
    res.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
    return res;
  }
  bool padded = false;
  for (const auto& p : prompts) padded = padded || static_cast<int64_t>(p.size()) != longest;
  const bool static_step = static_step_for(o.decode_step, dev);
  const bool penalty = o.sampling.repetition_penalty != 1.0;
  // Greedy without a penalty chooses its token inside the static step (in the graph when there is
  // one); otherwise the step gives the logits and the processors and the draw run after it.
  const bool choose_in_step = static_step && !o.sampling.do_sample && !penalty;
  // A graph pays off from its second step on; a sharding's group boundaries run host code per
  // layer, which a replay would skip.
  bool graph_wanted = static_step && dev.is_cuda() && o.cuda_graph && max_new > 2 &&
                      env_of("CIUIC_CUDA_GRAPH") != "0" && StepGraph::built() &&
                      model.group_boundaries() == nullptr;
  // The static step attends over the whole cache: its capacity rounded up to 16 slots keeps the
  // key bias's rows aligned for the CUDA attention kernels (no padded copy per layer).
  const int64_t capacity = static_step ? (longest + max_new + 15) / 16 * 16 : longest + max_new;
  LlamaModel::DecodeCache cache = model.new_decode_cache(b, capacity, !padded);
  // Every id seen so far, for the repetition penalty (transformers' input_ids, padding included).
  at::Tensor seen = penalty ? in_ids.to(dev) : at::Tensor();
  std::optional<at::Generator> gen;
  if (o.sampling.do_sample) gen = at::make_generator<at::CPUGeneratorImpl>(o.sampling.seed);
  // The tokens stay on the device from step to step: a finished row's token becomes the pad id
  // there (done_dev), positions advance there. The host reads each step's tokens from a copy
  // made after the step was queued, and reads step s - 1's while step s runs (on a GPU the next
  // step is queued before the host waits: no drain per token). A row's EOS is thus seen on the
  // host one step late; the extra step's tokens are pads or past the end, and are dropped. On
  // the CPU (no asynchronous copy) each step's tokens are read as soon as it returns.
  const bool async_copy = dev.is_cuda();
  at::Tensor host_tokens[2];
  std::optional<c10::Event> copied[2];
  for (int i = 0; i < 2; ++i) {
    host_tokens[i] = at::empty({b}, at::TensorOptions().dtype(at::kLong).pinned_memory(async_copy));
    if (async_copy) copied[i].emplace(dev.type());
  }
  const at::Tensor eos_dev =
      o.eos_ids.empty()
          ? at::Tensor()
          : at::tensor(std::vector<int64_t>(o.eos_ids.begin(), o.eos_ids.end()), cpu_long).to(dev);
  // The step's state on the device, updated in place (a captured graph's static buffers): which
  // rows finished, the tokens chosen last (the pad id on finished rows), their positions, the
  // cache slot they go to (static step), the static step's logits.
  const auto long_dev = at::TensorOptions().dtype(at::kLong).device(dev);
  at::Tensor done_dev = at::zeros({b}, at::TensorOptions().dtype(at::kBool).device(dev));
  at::Tensor ids_buf = at::zeros({b, 1}, long_dev);
  at::Tensor pos_buf = at::tensor(next_pos, cpu_long).view({b, 1}).to(dev);
  at::Tensor slot_buf = at::full({1}, longest, long_dev);
  at::Tensor logits_buf;
  // A step's chosen tokens [B]: the pad id on finished rows, the EOS check, into ids_buf.
  auto finish = [&](const at::Tensor& chosen) {
    const at::Tensor next = chosen.to(at::kLong).masked_fill(done_dev, pad);
    if (eos_dev.defined()) done_dev.logical_or_(next.unsqueeze(1).eq(eos_dev.unsqueeze(0)).any(1));
    ids_buf.copy_(next.view({b, 1}));
  };
  auto pick = [&](const at::Tensor& logits) {
    const at::Tensor scores = process_logits(logits, seen, o.sampling);
    if (o.sampling.do_sample)
      return at::multinomial(scores.softmax(-1).to(at::kCPU), 1, false, *gen).squeeze(1).to(dev);
    return scores.argmax(-1);
  };
  auto static_fn = [&] {  // what the graph captures
    logits_buf.copy_(model.decode_step(ids_buf, pos_buf, slot_buf, cache));
    pos_buf.add_(1);
    slot_buf.add_(1);
    if (choose_in_step) finish(logits_buf.argmax(-1));
  };
  std::unique_ptr<StepGraph> graph;
  std::vector<bool> done(static_cast<size_t>(b), false);
  bool all_done = false;
  int64_t processed = 0, queued = 0;  // steps whose tokens the host has taken / were queued
  auto take = [&](int64_t step) {     // the host side of step `step`, in order
    if (async_copy) copied[step % 2]->synchronize();
    const int64_t* nx = host_tokens[step % 2].data_ptr<int64_t>();
    all_done = true;
    for (int64_t r = 0; r < b; ++r) {
      const size_t ri = static_cast<size_t>(r);
      if (!done[ri]) {
        const auto tok = static_cast<int32_t>(nx[r]);
        res.tokens[ri].push_back(tok);
        if (o.on_token) o.on_token(ri, tok);
        if (std::find(o.eos_ids.begin(), o.eos_ids.end(), tok) != o.eos_ids.end()) {
          done[ri] = true;
          res.hit_eos[ri] = true;
        } else if (const StopStrings* stop = stop_of(ri);
                   stop &&
                   stop->matches(row_tail(ids, r, longest, res.tokens[ri], stop->window()))) {
          // Seen on the host only: the row becomes padding on the device from the next queued
          // step on (the one already queued is dropped here, as after an EOS).
          done[ri] = true;
          res.hit_stop[ri] = true;
          done_dev.index_fill_(0, at::tensor({r}, cpu_long).to(dev), true);
        }
      }
      all_done = all_done && done[ri];
    }
    ++res.steps;
    processed = step + 1;
    if (step == 0) res.first_token_s = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const at::Tensor ones_valid = at::ones({b, 1}, at::TensorOptions().dtype(at::kBool).device(dev));
  // A small model generates on one CPU thread, decided by its decode step's products (the prefill
  // too: one thread count for the whole call; model/llama_ops.h, SmallStepThreads).
  const SmallStepThreads threads(dev, largest_product_flops(cfg, b, b));
  for (int64_t step = 0; step < max_new; ++step) {
    if (o.cancelled && o.cancelled()) break;
    at::Tensor logits;  // [B, V] fp32
    bool chosen = false;
    if (step == 0) {
      logits = model.decode(in_ids.to(dev), in_pos.to(dev), in_valid.to(dev), cache);
    } else if (!static_step) {
      logits = model.decode(ids_buf, pos_buf, ones_valid, cache);
      pos_buf.add_(1);
      res.decode_step = "dynamic";
    } else {
      if (!logits_buf.defined())
        logits_buf =
            at::empty({b, cfg.vocab_size}, at::TensorOptions().dtype(at::kFloat).device(dev));
      if (graph) {
        graph->replay();
      } else if (graph_wanted) {
        std::string why;
        graph = StepGraph::capture(dev, static_fn, &why);  // runs this step, then captures it
        if (!graph) {
          log_warn("generate: " + why + "; the decode steps run without a CUDA graph");
          graph_wanted = false;
        }
      } else {
        static_fn();
      }
      logits = logits_buf;
      chosen = choose_in_step;
      res.decode_step = graph ? "cuda_graph" : "static";
    }
    if (o.on_logits) o.on_logits(logits);
    if (!chosen) finish(pick(logits));
    host_tokens[step % 2].copy_(ids_buf.view({b}), /*non_blocking=*/async_copy);
    if (async_copy)
      copied[step % 2]->record(c10::impl::getDeviceGuardImpl(dev.type())->getStream(dev));
    queued = step + 1;
    // The first token at once (time to first token); later ones a step late where the copy is
    // asynchronous (CUDA: the next step is queued before the host waits for this one), at once
    // on the CPU, where the tokens are there when the step returns (read late, the step after
    // the last row's EOS would run for nothing).
    if (step == 0 || !async_copy)
      take(step);
    else if (step >= 2)
      take(step - 1);
    if (all_done || step + 1 == max_new) break;
    if (penalty) seen = at::cat({seen, ids_buf}, 1);
  }
  // The steps queued but not yet taken (the last one; the one before a cancel), unless every
  // row had finished before them.
  while (!all_done && processed < queued) take(processed);
  res.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

}  // namespace ciuic::model
