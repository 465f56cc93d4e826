// Shared by the data tests and tools/data_probe: a trivial tokenizer and chat template whose ids
// can be predicted by hand, and plugin loading through the Registry.
//
// ByteTokenizer: id = byte + 3 for every byte of the text; BOS = 1, EOS = 2, 0 unused (padding).
//   encode(text, add_special_tokens = true) prepends BOS. Calls on texts starting with "doc" are
//   counted (encode_counter()) so tests can assert that a reused cache tokenized no document (the
//   cache's own probe texts do not start with "doc").
// TagChatTemplate: per message [role id] content-bytes, then EOS after assistant replies; role ids
//   259 system, 260 user, 261 assistant. assistant_only: loss on the reply bytes and its EOS.
#pragma once

#include <atomic>
#include <chrono>
#include <ciuic/files.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/store.h>
#include <ciuic/tokenizer.h>

#include "registry/registry.h"

namespace ciuic::testdata {

inline std::atomic<int64_t>& encode_counter() {
  static std::atomic<int64_t> n{0};
  return n;
}

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(std::string salt = "") : salt_(std::move(salt)) {}
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    if (text.substr(0, 3) == "doc") ++encode_counter();
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(1);
    for (unsigned char c : text) ids.push_back(c + 3);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string s;
    for (int32_t id : ids)
      if (id >= 3 && id < 259) s += static_cast<char>(id - 3);
    return s;
  }
  int32_t vocab_size() const override { return 262; }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  std::optional<int32_t> bos_id() const override { return 1; }
  std::optional<int32_t> eos_id() const override { return 2; }
  std::string fingerprint() const override { return "byte-tokenizer-v1" + salt_; }

 private:
  std::string salt_;
};

class TagChatTemplate final : public ChatTemplate {
 public:
  explicit TagChatTemplate(const Tokenizer& t) : tok_(t) {}
  std::string name() const override { return "tags"; }
  std::string render(const std::vector<ChatMessage>& m) const override {
    std::string s;
    for (const auto& x : m) s += "<" + x.role + ">" + x.content;
    return s;
  }
  EncodedChat encode(const std::vector<ChatMessage>& messages, bool assistant_only) const override {
    EncodedChat e;
    for (const auto& m : messages) {
      const int32_t role = m.role == "system" ? 259 : m.role == "user" ? 260 : 261;
      const bool reply = m.role == "assistant";
      e.ids.push_back(role);
      e.loss_mask.push_back(!assistant_only);
      for (int32_t id : tok_.encode(m.content, false)) {
        e.ids.push_back(id);
        e.loss_mask.push_back(!assistant_only || reply);
      }
      if (reply) {
        e.ids.push_back(2);
        e.loss_mask.push_back(1);
      }
    }
    return e;
  }
  std::vector<int32_t> encode_prompt(const std::vector<ChatMessage>& messages) const override {
    EncodedChat e = encode(messages, false);
    e.ids.push_back(261);
    return e.ids;
  }

 private:
  const Tokenizer& tok_;
};

inline const Registry& registry() {
  static Registry r = Registry::from_paths({CIUIC_PLUGIN_DIR});
  return r;
}

// The message of what f() throws, or "(no error)".
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// A fresh folder under CIUIC_TEST_TMP.
inline std::string temp_dir(const std::string& name) {
  std::string d = std::string(CIUIC_TEST_TMP) + "/data/" + name;
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(d).string(), rm_ec);
  }
  std::filesystem::create_directories(d);
  return d;
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline RunContext make_context(const std::string& dir, int rank = 0, int world = 1) {
  RunContext c;
  c.rank = rank;
  c.world_size = world;
  c.recipe_dir = dir;
  c.output_dir = dir + "/out";
  c.store = make_local_store(std::chrono::seconds(30));
  return c;
}

}  // namespace ciuic::testdata
