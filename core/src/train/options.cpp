// TrainOptions::from (train/options.h): the one place the trainer reads core recipe keys.
#include "train/options.h"

#include <filesystem>

#include <ciuic/config.h>
#include <ciuic/error.h>

#include "base/paths.h"
#include "base/text.h"
#include "recipe/recipe.h"

namespace fs = std::filesystem;

namespace ciuic::train {

checkpoint::RunPaths TrainOptions::run_paths() const {
  checkpoint::RunPaths p;
  p.output_dir = output_dir;
  p.checkpoint_dir = checkpoint_dir;
  p.metrics_file = metrics_path;
  p.hf_dir = hf_dir;
  return p;
}

namespace {

// [train] eval_metrics, bleu_tokenize, rouge_use_stemmer: a bad value is a usage error naming the
// key.
void read_eval_metrics(const Config& t, TrainOptions& o) {
  const std::vector<std::string> known = {"exact_match", "bleu", "rouge_l", "response_time"};
  o.eval_bleu = o.eval_rouge_l = o.eval_response_time = false;
  for (const std::string& m : t.get_string_list("eval_metrics")) {
    if (m == "exact_match") continue;  // always reported (the record's accuracy)
    if (m == "bleu")
      o.eval_bleu = true;
    else if (m == "rouge_l")
      o.eval_rouge_l = true;
    else if (m == "response_time")
      o.eval_response_time = true;
    else {
      std::string msg = "[train] eval_metrics: \"" + m +
                        "\" is not a metric: expected exact_match, bleu, rouge_l or response_time";
      if (const std::string near = text::closest(m, known); !near.empty())
        msg += "; did you mean \"" + near + "\"?";
      throw UsageError(msg);
    }
  }
  o.bleu_tokenize = t.get_string("bleu_tokenize");
  o.rouge_use_stemmer = t.get_bool("rouge_use_stemmer");
}

}  // namespace

TrainOptions TrainOptions::from(const Recipe& recipe) {
  TrainOptions o;
  const Config t = recipe.section("train");
  const RecipeBatch batch = recipe_batch(recipe);
  o.micro_batch = batch.micro;
  o.accumulation = batch.accumulation;
  o.micro_batch_auto = batch.micro_auto;
  o.seq_len = t.get_int("seq_len");
  o.max_steps = t.get_int("max_steps");
  o.clip = t.get_float("gradient_clipping");
  o.eval_every = t.get_int("eval_every_steps");
  o.eval_batches = t.get_int("eval_batches");
  o.nonfinite_skip = t.get_string("nonfinite") == "skip";
  o.max_nonfinite_skips = t.get_int("max_nonfinite_skips");
  o.exact_match_file = resolve_input(t.get_string("exact_match_file"), recipe.dir());
  o.exact_match_limit = t.get_int("exact_match_limit");
  o.exact_match_max_new_tokens = t.get_int("exact_match_max_new_tokens");
  o.exact_match_every = t.get_int("exact_match_every_steps");
  o.exact_match_batch = t.get_int("exact_match_batch_size");
  read_eval_metrics(t, o);

  const Config opt = recipe.section("optimizer");
  o.lr = opt.get_float("lr");
  o.weight_decay = opt.get_float("weight_decay");

  const Config m = recipe.section("model");
  o.model_path = resolve_input(m.get_string("path"), recipe.dir());
  o.tokenizer_path = resolve_input(m.get_string("tokenizer"), recipe.dir());
  if (o.tokenizer_path.empty() && !o.model_path.empty() &&
      paths::is((fs::path(o.model_path) / "tokenizer.json").string(), paths::Want::kAny))
    o.tokenizer_path = (fs::path(o.model_path) / "tokenizer.json").string();
  o.chat_template = m.get_string("chat_template");
  o.activation_checkpointing = m.get_bool("activation_checkpointing");
  o.checkpoint_layers_auto = is_auto(m, "checkpoint_layers");
  o.checkpoint_layers = o.checkpoint_layers_auto ? 0 : m.get_int("checkpoint_layers");
  o.fused_kernels = m.get_string("fused_kernels");
  o.loss_backward = m.get_string("loss_backward");
  o.init_std = m.get_float("init_std");
  o.lora = plan::recipe_adapter(recipe);

  const Config run = recipe.section("run");
  o.output_dir = run.get_string("output_dir");
  o.run_name = run.get_string("name");
  o.seed = static_cast<uint64_t>(run.get_int("seed"));
  o.setup = run.get_string("setup");
  const Config cluster = recipe.section("cluster");
  o.cuda = cluster.get_string("device") == "cuda";
  o.memory_cap_gib = cluster.get_float("memory_per_device_gib");
  o.timeout_s = cluster.get_float("timeout_s");

  const Config c = recipe.section("checkpoint");
  o.checkpoint_dir = c.get_string("dir").empty() ? (fs::path(o.output_dir) / "checkpoints").string()
                                                 : c.get_string("dir");
  o.checkpoint_every = c.get_int("every_steps");
  o.keep_last = c.get_int("keep_last");
  o.export_hf = c.get_bool("export_hf");
  o.export_dtype = c.get_string("export_dtype");
  o.save_on_signal = c.get_bool("on_signal");
  o.save_final = c.get_bool("save_final");
  o.hf_dir = (fs::path(o.output_dir) / "hf").string();

  const Config l = recipe.section("log");
  o.log_every = l.get_int("every_steps");
  o.metrics_path = (fs::path(o.output_dir) / l.get_string("metrics_file")).string();
  o.progress = l.get_string("progress");
  o.peak_tflops = l.get_float("peak_tflops");
  o.tensorboard = l.get_bool("tensorboard");
  o.profile_start = l.get_int("profile_start_step");
  o.profile_steps = l.get_int("profile_steps");
  o.rank_records = l.get_bool("rank_records");
  o.straggler_margin = l.get_float("straggler_margin");
  o.straggler_log_steps = l.get_int("straggler_log_steps");
  return o;
}

}  // namespace ciuic::train
