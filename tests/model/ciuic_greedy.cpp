// ciuic_greedy — ciuic's side of tests/model/hf_export_stops_at_eos.py: loads an exported
// Hugging Face folder with ciuic's own loader and tokenizer, encodes what the request asks and
// decodes greedily with LlamaModel::generate_greedy, stopping at the tokenizer's EOS (as the
// trainer's exact-match evaluation does).
//
//   ciuic_greedy <hf folder> <request.json>
//
// request.json: {"dtype": "fp32"|"bf16", "max_new_tokens": N,
//                "texts": [str, ...],                  encoded with and without special tokens
//                "text_prompts": [str, ...],           encode(add_special_tokens) -> generate
//                "chat_prompts": [[{role, content}...]]} the folder's "hf" template's
//                                                      encode_prompt -> generate
// Prints one JSON object: {"bos_id", "eos_id", "vocab_size",
//   "texts": [{"ids", "ids_special", "decoded"}], "text_prompts"/"chat_prompts": [{"prompt",
//   "generated"}]} ("generated": the new ids, ending with EOS when it was produced).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "model/llama.h"
#include "tokenizer/factory.h"

int main(int argc, char** argv) {
  using nlohmann::json;
  if (argc != 3) {
    std::fprintf(stderr, "usage: ciuic_greedy <hf folder> <request.json>\n");
    return 2;
  }
  try {
    const std::string folder = argv[1];
    std::stringstream in;
    in << std::ifstream(argv[2]).rdbuf();
    const json req = json::parse(in.str());
    const std::string dtype_name = req.value("dtype", "fp32");
    const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
    const int64_t max_new = req.value("max_new_tokens", 200);

    auto model = ciuic::model::LlamaModel::from_pretrained(folder, dtype, c10::Device(c10::kCPU));
    auto tok = ciuic::load_tokenizer(folder + "/tokenizer.json");
    json out;
    out["bos_id"] = tok->bos_id() ? json(*tok->bos_id()) : json(nullptr);
    out["eos_id"] = tok->eos_id() ? json(*tok->eos_id()) : json(nullptr);
    out["vocab_size"] = tok->vocab_size();
    out["texts"] = json::array();
    for (const auto& t : req.value("texts", json::array())) {
      const auto ids = tok->encode(t.get<std::string>(), false);
      out["texts"].push_back({{"ids", ids},
                              {"ids_special", tok->encode(t.get<std::string>(), true)},
                              {"decoded", tok->decode(ids)}});
    }
    auto generate = [&](const std::vector<int32_t>& prompt) {
      return json{{"prompt", prompt},
                  {"generated", model->generate_greedy(prompt, max_new, tok->eos_id())}};
    };
    out["text_prompts"] = json::array();
    for (const auto& t : req.value("text_prompts", json::array()))
      out["text_prompts"].push_back(generate(tok->encode(t.get<std::string>(), true)));
    out["chat_prompts"] = json::array();
    if (req.contains("chat_prompts") && !req["chat_prompts"].empty()) {
      auto tmpl = ciuic::make_chat_template("hf", *tok);
      for (const auto& conv : req["chat_prompts"]) {
        std::vector<ciuic::ChatMessage> msgs;
        for (const auto& m : conv)
          msgs.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
        out["chat_prompts"].push_back(generate(tmpl->encode_prompt(msgs)));
      }
    }
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ciuic_greedy: %s\n", e.what());
    return 1;
  }
}
