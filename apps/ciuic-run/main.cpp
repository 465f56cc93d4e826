// ciuic-run: train from a recipe, list plugins, print the resolved recipe.
// Argument parsing only; the work is done by the core (core/src/app/cli.h).
#include <unistd.h>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <c10/util/Exception.h>

#include <ciuic/error.h>

#include "app/cli.h"
#include "app/generate_cli.h"
#include "registry/registry.h"
#include "sdk/printable.h"

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "usage: ciuic-run RECIPE [--set section.key=value]... [--plugin-path DIR]... [--nproc N]\n"
    "                 [--nnodes N] [--node-rank R] [--master-addr A] [--master-port P]\n"
    "                 [--output-all-ranks] [--resume PATH|latest|auto | --overwrite] [--dry-run]\n"
    "                 [--print-recipe] [--plan]\n"
    "       ciuic-run --export-hf CKPT OUT [--export-dtype bf16|fp32] [--tokenizer FILE] "
    "[--merge]\n"
    "       ciuic-run --from-deepspeed DS_CONFIG.json [--set section.key=value]... [-o "
    "RECIPE.toml]\n"
    "       ciuic-run --from-llamafactory TRAIN.yaml | --from-axolotl CONFIG.yml [--set ...]... "
    "[-o RECIPE.toml]\n"
    "       ciuic-run --plot RUN_DIR\n"
    "       ciuic-run --watch RUN_DIR [--interval S]\n"
    "       ciuic-run --generate DIR (--prompt TEXT... | --prompts FILE.jsonl) [--out OUT.jsonl] "
    "[sampling]\n"
    "       ciuic-run --chat DIR [--system TEXT] [sampling]\n"
    "       ciuic-run --list-plugins [--verbose] [--plugin-path DIR]...\n"
    "       ciuic-run --help | --help-recipe | --version\n";

void print_help(const po::options_description& visible) {
  std::cout
      << kUsage << "\n"
      << "Fine-tunes a Llama/DeepSeek-architecture model as the TOML recipe RECIPE says. Without "
         "a\n"
         "launcher around it, ciuic-run starts nproc_per_node worker processes itself "
         "(single-process\n"
         "runs stay in this process); under torchrun, srun or mpirun it runs as one worker.\n"
      << visible << "\n"
      << "Recipe sections (every key, type and default: ciuic-run --help-recipe; plugin options:\n"
         "ciuic-run --list-plugins --verbose):\n"
      << ciuic::app::recipe_sections_text() << "\n"
      << "Exit codes:\n"
         "  0    success\n"
         "  1    runtime failure (training diverged, I/O error, worker crash, out of memory, ...)\n"
         "  2    usage error: command line, recipe (all its errors are listed, each with\n"
         "       file:line:col), plugin (refused, unknown, bad option)\n"
         "  130  interrupted by SIGINT/SIGTERM (a checkpoint was written if [checkpoint] "
         "on_signal)\n\n"
         "Plugins are searched in <ciuic-run folder>/../lib/ciuic/plugins, the core library's\n"
         "lib/ciuic/plugins, $CIUIC_PLUGIN_PATH, --plugin-path, then [run] plugin_paths.\n\n"
         "Documentation: docs/recipe.md (recipe reference), docs/plugins.md (writing plugins) in "
         "the\n"
         "source tree; installed under <prefix>/share/doc/ciuic/.\n";
}

// The last printer of every failure: a message of another library (boost, c10) may quote the
// command line or a file raw, so its control bytes are shown escaped here too (ciuic::Error's
// already are: sdk/printable.h).
int fail(const std::string& message, int code) {
  std::cerr << "ciuic-run: error: " << ciuic::printable_text(message) << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  ciuic::app::CliOptions o;
  bool list = false, verbose = false;
  int nproc = 0, nnodes = 0;

  po::options_description run_opts("Running a recipe", 100, 50);
  run_opts.add_options()(
      "set",
      po::value<std::vector<std::string>>(&o.overrides)
          ->composing()
          ->value_name("section.key=value"),
      "override one recipe value (repeatable); the value is TOML (train.seq_len=128, "
      "run.name='\"x\"', optimizer.betas=[0.9,0.95]) or a bare word taken as a string "
      "(comm.plugin=gloo)")(
      "plugin-path",
      po::value<std::vector<std::string>>(&o.plugin_paths)->composing()->value_name("DIR"),
      "also search DIR (or one plugin file) for plugins (repeatable; later paths win on duplicate "
      "names)")("nproc", po::value<int>(&nproc)->value_name("N"),
                "worker processes per node (overrides [cluster] nproc_per_node)")(
      "nnodes", po::value<int>(&nnodes)->value_name("N"),
      "number of nodes (overrides [cluster] nnodes)")(
      "node-rank", po::value<int>(&o.node_rank)->value_name("R"),
      "rank of this node, 0..nnodes-1 (multi-node)")(
      "master-addr", po::value<std::string>(&o.master_addr)->value_name("A"),
      "address of node 0's rendezvous store (default 127.0.0.1)")(
      "master-port", po::value<int>(&o.master_port)->value_name("P"),
      "port of the rendezvous store (default: a free port; required with several nodes)")(
      "output-all-ranks", po::bool_switch(&o.output_all_ranks),
      "show every rank's output, prefixed by its rank (default: rank 0 and errors)")(
      "resume", po::value<std::string>(&o.resume)->value_name("PATH|latest|auto"),
      "resume from a checkpoint folder, or the newest one under [checkpoint] dir (latest; auto: "
      "the newest if any, else start fresh)")(
      "overwrite", po::bool_switch(&o.overwrite),
      "start fresh in a run.output_dir or [checkpoint] dir that holds another run's checkpoints, "
      "metrics or hf/ export: move them into <dir>/replaced-<date-time>/ first (nothing is "
      "deleted). Without --resume or --overwrite such a folder is refused")(
      "dry-run", po::bool_switch(&o.dry_run),
      "validate the recipe, create every chosen plugin once in this process, then open every input "
      "the run reads (the model's config.json and weights, tokenizer and chat template, the data "
      "plugin as rank 0, the --resume checkpoint), print a summary, exit; trains nothing")(
      "plan", po::bool_switch(&o.plan),
      "print the memory plan per rank (parameters, gradients, optimizer state, activations; device "
      "and host) and whether it fits [cluster] memory_per_device_gib, then exit; allocates "
      "nothing. The "
      "same plan sizes [train] micro_batch_size = \"auto\" and [model] checkpoint_layers = "
      "\"auto\" at start")(
      "print-recipe", po::bool_switch(&o.print_recipe),
      "print the resolved recipe (defaults included, origin of each value) and exit");
  std::vector<std::string> export_args;
  std::string export_dtype = "bf16", export_tokenizer;
  bool export_merge = false;
  po::options_description export_opts("Exporting a checkpoint (no recipe needed)", 100, 50);
  export_opts.add_options()(
      "export-hf",
      po::value<std::vector<std::string>>(&export_args)->multitoken()->value_name("CKPT OUT"),
      "write a Hugging Face folder OUT (config.json, safetensors) from the checkpoint folder CKPT, "
      "or the newest one under the checkpoint dir CKPT, saved at any world size; OUT must not "
      "exist or be empty")("export-dtype",
                           po::value<std::string>(&export_dtype)->value_name("bf16|fp32"),
                           "with --export-hf: dtype of the exported weights (default bf16)")(
      "tokenizer", po::value<std::string>(&export_tokenizer)->value_name("FILE"),
      "with --export-hf: a tokenizer.json to copy into OUT (with its tokenizer_config.json and "
      "chat_template.jinja) instead of the one the checkpoint keeps")(
      "merge", po::bool_switch(&export_merge),
      "with --export-hf of a LoRA checkpoint: the base model with the adapter merged in (PEFT's "
      "merge_and_unload) instead of the PEFT adapter folder");
  std::string from_ds, from_lf, from_ax, output, plot_dir, watch_dir;
  double watch_interval = 2.0;
  po::options_description tool_opts("Converting and reporting (no recipe needed)", 100, 50);
  tool_opts.add_options()("from-deepspeed", po::value<std::string>(&from_ds)->value_name("FILE"),
                          "write an equivalent recipe for the DeepSpeed config FILE "
                          "(docs/deepspeed.md); --set gives recipe "
                          "keys for \"auto\" values and the rest (model, data, max_steps); "
                          "--nproc/--nnodes give the world size")(
      "from-llamafactory", po::value<std::string>(&from_lf)->value_name("FILE"),
      "write a recipe for the LLaMA-Factory training YAML FILE and the DeepSpeed config it names; "
      "its datasets "
      "are converted into RECIPE-data/ (docs/migrate.md)")(
      "from-axolotl", po::value<std::string>(&from_ax)->value_name("FILE"),
      "the same for an axolotl config YAML (docs/migrate.md)")(
      "output,o", po::value<std::string>(&output)->value_name("FILE"),
      "with --from-deepspeed/--from-llamafactory/--from-axolotl: write the recipe to FILE instead "
      "of stdout")("plot", po::value<std::string>(&plot_dir)->value_name("RUN_DIR"),
                   "write RUN_DIR/report.html (loss, eval loss, lr, grad norm, tokens/s, MFU, "
                   "memory over steps) from "
                   "RUN_DIR/metrics.jsonl and print its path (also while the run is going)")(
      "watch", po::value<std::string>(&watch_dir)->value_name("RUN_DIR"),
      "follow a run from another terminal: a table of every rank (memory, busy %, link GB/s, step "
      "time, "
      "data wait) under the step, loss and ETA, refreshed until the run ends (exit 0; 1 when it "
      "stopped "
      "without its end record)")("interval", po::value<double>(&watch_interval)->value_name("S"),
                                 "with --watch: seconds between refreshes (default 2)");
  ciuic::app::GenerateCliOptions g;
  std::string generate_dir, chat_dir;
  double temperature = 1, top_p = 1, min_p = 0, repetition_penalty = 1;
  int64_t top_k = 50;
  bool sample = false, greedy = false;
  po::options_description gen_opts("Generating with a model (no recipe needed)", 100, 50);
  gen_opts.add_options()(
      "generate", po::value<std::string>(&generate_dir)->value_name("DIR"),
      "generate for each prompt with the Hugging Face folder DIR (or a run's "
      "output folder: its hf/ export); "
      "one JSON line per prompt: text, ids, new_tokens, stopped (eos|stop_string|length), "
      "first_token_s, seconds")(
      "prompt", po::value<std::vector<std::string>>(&g.prompts)->composing()->value_name("TEXT"),
      "with --generate: a raw prompt, encoded with the tokenizer's special tokens (repeatable)")(
      "prompts", po::value<std::string>(&g.prompts_file)->value_name("FILE.jsonl"),
      "with --generate: one {\"prompt\": TEXT} or {\"messages\": [{role, content}...]} (chat "
      "template) per line")("out", po::value<std::string>(&g.out)->value_name("OUT.jsonl"),
                            "with --generate: write the results to OUT (default stdout)")(
      "batch", po::value<int64_t>(&g.batch)->value_name("N"),
      "with --generate: prompts per batch (default 8)")(
      "chat", po::value<std::string>(&chat_dir)->value_name("DIR"),
      "talk to the model in DIR in the terminal with its chat template, replies streamed; /reset, "
      "/system TEXT, /exit; Ctrl-C stops a reply")(
      "system", po::value<std::string>(&g.system)->value_name("TEXT"),
      "with --chat: the system message")("max-new-tokens",
                                         po::value<int64_t>(&g.max_new_tokens)->value_name("N"),
                                         "new tokens at most per reply (default 256)")(
      "do-sample", po::bool_switch(&sample),
      "sample (default: generation_config.json's do_sample, else greedy)")(
      "greedy", po::bool_switch(&greedy),
      "greedy decoding even where generation_config.json samples")(
      "temperature", po::value<double>(&temperature)->value_name("T"), "sampling temperature, > 0")(
      "top-k", po::value<int64_t>(&top_k)->value_name("K"),
      "keep the K most likely tokens, >= 0 (0: off; default 50)")(
      "top-p", po::value<double>(&top_p)->value_name("P"), "nucleus sampling, in (0, 1] (1: off)")(
      "min-p", po::value<double>(&min_p)->value_name("P"),
      "drop tokens below P times the top one's probability, in [0, 1]")(
      "repetition-penalty", po::value<double>(&repetition_penalty)->value_name("R"),
      "divide (or multiply, when negative) the scores of seen tokens by R, > 0 (1: off)")(
      "seed", po::value<uint64_t>(&g.seed)->value_name("S"), "sampling seed (default 0)")(
      "stop-string",
      po::value<std::vector<std::string>>(&g.stop_strings)->composing()->value_name("TEXT"),
      "stop a reply once its text ends with TEXT, kept in the reply (repeatable; transformers' "
      "stop_strings; default: generation_config.json's)")(
      "dtype", po::value<std::string>(&g.dtype)->value_name("float32|bfloat16"),
      "weights' dtype for generation (default float32)")(
      "device", po::value<std::string>(&g.device)->value_name("cpu|cuda[:N]"),
      "where --generate/--chat run (default cpu)");
  po::options_description info_opts("Information", 100, 50);
  info_opts.add_options()("list-plugins", po::bool_switch(&list),
                          "list the plugins found: <slot> <name> <version> <path>")(
      "verbose,v", po::bool_switch(&verbose),
      "with --list-plugins: every option (key, default, type, help)")("help,h", "this help")(
      "help-recipe", "every core recipe key with its type, default and meaning")(
      "version", "ciuic and LibTorch versions, build fingerprint, plugin API version");
  po::options_description hidden;
  hidden.add_options()("recipe", po::value<std::string>(&o.recipe));
  po::options_description all;
  all.add(run_opts).add(export_opts).add(tool_opts).add(gen_opts).add(info_opts).add(hidden);
  po::options_description visible(100, 50);
  visible.add(run_opts).add(export_opts).add(tool_opts).add(gen_opts).add(info_opts);
  po::positional_options_description pos;
  pos.add("recipe", 1);

  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      print_help(visible);
      return 0;
    }
    if (vm.count("help-recipe")) {
      std::cout << ciuic::app::recipe_reference_text();
      return 0;
    }
    if (vm.count("version")) {
      std::cout << ciuic::app::version_text();
      return 0;
    }
    if (vm.count("nproc")) o.nproc = nproc;
    if (vm.count("nnodes")) o.nnodes = nnodes;
    for (int i = 0; i < argc; ++i) o.argv.emplace_back(argv[i]);
    if (list) {
      if (!o.recipe.empty())
        return fail("--list-plugins takes no recipe (use --print-recipe to check one)", 2);
      return ciuic::app::list_plugins(ciuic::Registry::discover(o.plugin_paths), verbose, std::cout,
                                      std::cerr);
    }
    if (vm.count("export-hf")) {
      if (!o.recipe.empty()) return fail("--export-hf takes no recipe: --export-hf CKPT OUT", 2);
      if (export_args.size() != 2)
        return fail("--export-hf takes two arguments, CKPT and OUT (got " +
                        std::to_string(export_args.size()) + ")",
                    2);
      return ciuic::app::export_hf(export_args[0], export_args[1], export_dtype, export_tokenizer,
                                   std::cout, export_merge);
    }
    if (vm.count("from-deepspeed")) {
      if (!o.recipe.empty())
        return fail(
            "--from-deepspeed takes no recipe: --from-deepspeed DS_CONFIG.json [-o RECIPE.toml]",
            2);
      return ciuic::app::from_deepspeed(from_ds, ciuic::app::effective_overrides(o), output,
                                        std::cout, std::cerr);
    }
    for (const char* tool : {"llamafactory", "axolotl"}) {
      if (!vm.count(std::string("from-") + tool)) continue;
      if (!o.recipe.empty() || vm.count("from-deepspeed") ||
          (vm.count("from-llamafactory") && vm.count("from-axolotl")))
        return fail(std::string("--from-") + tool + " takes one training file and no recipe", 2);
      return ciuic::app::from_training_file(
          tool, std::string(tool) == "axolotl" ? from_ax : from_lf,
          ciuic::app::effective_overrides(o), output, std::cout, std::cerr);
    }
    if (vm.count("output"))
      return fail("-o/--output goes with --from-deepspeed, --from-llamafactory or --from-axolotl",
                  2);
    if (vm.count("plot")) {
      if (!o.recipe.empty())
        return fail("--plot takes a run folder, not a recipe: --plot RUN_DIR", 2);
      return ciuic::app::plot(plot_dir, std::cout);
    }
    if (vm.count("watch")) {
      if (!o.recipe.empty())
        return fail("--watch takes a run folder, not a recipe: --watch RUN_DIR", 2);
      return ciuic::app::watch(watch_dir, watch_interval, isatty(STDOUT_FILENO) != 0, std::cout);
    }
    if (vm.count("generate") || vm.count("chat")) {
      if (!o.recipe.empty()) return fail("--generate/--chat take a model folder, not a recipe", 2);
      if (vm.count("generate") && vm.count("chat"))
        return fail("give --generate or --chat, not both", 2);
      if (sample && greedy) return fail("give --do-sample or --greedy, not both", 2);
      if (sample || greedy) g.do_sample = sample;
      if (vm.count("temperature")) g.temperature = temperature;
      if (vm.count("top-k")) g.top_k = top_k;
      if (vm.count("top-p")) g.top_p = top_p;
      if (vm.count("min-p")) g.min_p = min_p;
      if (vm.count("repetition-penalty")) g.repetition_penalty = repetition_penalty;
      if (vm.count("chat")) {
        g.folder = chat_dir;
        return ciuic::app::chat_cli(g, std::cin, std::cout, std::cerr);
      }
      g.folder = generate_dir;
      return ciuic::app::generate_cli(g, std::cout, std::cerr);
    }
    for (const char* k :
         {"prompt", "prompts", "out", "batch", "system", "max-new-tokens", "temperature", "top-k",
          "top-p", "min-p", "repetition-penalty", "seed", "stop-string", "dtype", "device"})
      if (vm.count(k)) return fail(std::string("--") + k + " goes with --generate or --chat", 2);
    if (vm.count("interval")) return fail("--interval goes with --watch", 2);
    if (o.recipe.empty()) {
      std::cerr << kUsage;
      return fail("no recipe given (see ciuic-run --help)", 2);
    }
    if (o.nproc && *o.nproc < 1) return fail("--nproc must be >= 1", 2);
    if (o.nnodes && *o.nnodes < 1) return fail("--nnodes must be >= 1", 2);
    return ciuic::app::run_recipe(o);
  } catch (const po::error& e) {
    return fail(std::string(e.what()) + " (see ciuic-run --help)", ciuic::kExitUsage);
  } catch (const ciuic::Error& e) {
    return fail(e.what(), e.exit_code());
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace(), ciuic::kExitRuntime);
  } catch (const std::exception& e) {
    return fail(e.what(), ciuic::kExitRuntime);
  }
}
