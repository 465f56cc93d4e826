// The checkpoint policy of a run (train/checkpoints.h).
#include "train/checkpoints.h"

#include <filesystem>

#include <ciuic/log.h>

#include "model/hf_export.h"

namespace fs = std::filesystem;

namespace ciuic::train {

Checkpoints::Checkpoints(Run& run, const std::string& resume)
    : r_(run), ckpt_(run.opt.checkpoint_dir, run.opt.keep_last, run.ctx) {
  shape_.model = run.model->config();
  shape_.global_rows = run.opt.micro_batch * run.opt.accumulation * run.ctx.world_size;
  shape_.seq_len = run.opt.seq_len;
  for (const auto& [name, t] : run.model->trainable_parameters())
    shape_.params.emplace_back(name, t.sizes().vec());
  if (const model::LoraSpec* lora = run.model->lora())
    shape_.adapter = model::peft_adapter_config(
        *lora, run.opt.model_path.empty() ? std::string()
                                          : std::filesystem::absolute(run.opt.model_path).string());
  // QLoRA: what --merge needs to rebuild the base the adapter was trained on (not a PEFT key:
  // write_peft_folder leaves it out of adapter_config.json).
  if (run.model->base_quantized())
    shape_.adapter["ciuic_base_quantization"] = {
        {"quant_type", "nf4"},
        {"blocksize", 64},
        {"double_quant", true},
        {"dtype", run.model->dtype() == at::kBFloat16 ? "bfloat16"
                  : run.model->dtype() == at::kHalf   ? "float16"
                                                      : "float32"}};
  shape_.tokenizer_files = model::tokenizer_files(run.opt.tokenizer_path);
  parts_ =
      checkpoint::Parts{run.comm.get(), run.sharding.get(), run.precision.get(), run.data.get()};

  const bool rank0 = run.ctx.rank == 0;
  const std::string folder = resume_folder(ckpt_.dir(), resume);
  if (resume == "auto" && folder.empty() && rank0)
    log_info("--resume auto: no checkpoint in " + ckpt_.dir() + "; starting fresh");
  if (folder.empty()) return;
  st_ = ckpt_.load(folder, shape_, parts_);
  if (rank0) log_info("resumed from " + folder + " at step " + std::to_string(st_.step));
}

std::string Checkpoints::resume_folder(const std::string& dir, const std::string& resume) {
  // --resume auto: the newest checkpoint if there is one, else a fresh start (for jobs that are
  // restarted after preemption with the same command line).
  if (resume.empty() || (resume == "auto" && checkpoint::latest(dir).empty())) return "";
  return checkpoint::resolve(resume == "auto" ? "latest" : resume, dir);
}

std::string Checkpoints::save() {
  const std::string where = ckpt_.save(st_, shape_, parts_);
  if (r_.ctx.rank == 0) log_info("checkpoint saved: " + where);
  return where;
}

void Checkpoints::after_step() {
  const int64_t every = r_.opt.checkpoint_every;
  if (every > 0 && st_.step % every == 0 && st_.step < r_.opt.max_steps) save();
}

void Checkpoints::on_signal(const std::string& cursor) {
  if (!r_.opt.save_on_signal || st_.step == 0) return;
  // The interrupted step had already taken its batches: give them back, so that a resumed run
  // trains on exactly the batches an uninterrupted one would have.
  r_.data->seek(cursor);
  save();
}

void Checkpoints::finish() {
  std::string final_ckpt;
  if (r_.opt.save_final || r_.opt.export_hf) final_ckpt = save();
  if (!r_.opt.export_hf || r_.ctx.rank != 0) return;
  // The Hugging Face export is made from the checkpoint's fp32 master weights.
  const std::string& out = r_.opt.hf_dir;
  model::HfExportOptions eo;
  eo.dtype = model::export_dtype_from_name(r_.opt.export_dtype).value_or(at::kBFloat16);
  eo.extra_files = shape_.tokenizer_files;
  if (!shape_.adapter
           .is_null()) {  // a PEFT adapter folder (ciuic-run --export-hf --merge: the merged model)
    model::write_peft_folder(out, shape_.adapter, checkpoint::read_master_weights(final_ckpt),
                             eo.dtype);
    log_info("exported the PEFT adapter to " + out);
    return;
  }
  model::write_hf_folder(out, r_.model->config(), checkpoint::read_master_weights(final_ckpt), eo);
  log_info("exported Hugging Face model to " + out);
}

}  // namespace ciuic::train
