// YAML training files -> YamlNode, with depth, alias and tag bounds (see yaml.h).
#include "import/yaml.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <unordered_map>

#include <yaml.h>

#include <ciuic/error.h>

#include "sdk/printable.h"

namespace ciuic::importer {

const YamlNode* YamlNode::find(const std::string& key) const {
  if (kind != Kind::kMap) return nullptr;
  for (const auto& [k, v] : map)
    if (k == key) return &v;
  return nullptr;
}

bool YamlNode::is_null() const {
  if (kind == Kind::kNull) return true;
  return kind == Kind::kScalar && plain &&
         (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL");
}

std::optional<bool> YamlNode::as_bool() const {
  if (kind != Kind::kScalar || !plain) return std::nullopt;
  for (const char* t : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"})
    if (text == t) return true;
  for (const char* f : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"})
    if (text == f) return false;
  return std::nullopt;
}

std::optional<double> YamlNode::as_number() const {
  if (kind != Kind::kScalar || text.empty()) return std::nullopt;
  std::string s;
  for (char c : text)
    if (c != '_') s += c;  // YAML 1.1 allows 1_000
  size_t start = s[0] == '+' ? 1 : 0;
  const bool neg = s[0] == '-';
  const size_t digits = start + (neg ? 1 : 0);
  // YAML 1.1 integers as PyYAML reads them: 0x1F (hex), 017 (octal).
  if (s.size() > digits + 1 && s[digits] == '0' && s.find_first_of(".eE") == std::string::npos) {
    const bool hex = s[digits + 1] == 'x' || s[digits + 1] == 'X';
    const size_t from = digits + (hex ? 2 : 1);
    long long v = 0;
    auto r = std::from_chars(s.data() + from, s.data() + s.size(), v, hex ? 16 : 8);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size() || from == s.size())
      return std::nullopt;
    return neg ? -static_cast<double>(v) : static_cast<double>(v);
  }
  double d = 0;
  auto r = std::from_chars(s.data() + start, s.data() + s.size(), d);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  if (!std::isfinite(d)) return std::nullopt;  // "nan", "inf": not a setting
  return d;
}

std::optional<std::string> YamlNode::as_string() const {
  if (kind != Kind::kScalar || is_null()) return std::nullopt;
  return text;
}

std::string YamlNode::where() const {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

namespace {

struct Parser {
  yaml_parser_t p;
  Parser() { yaml_parser_initialize(&p); }
  ~Parser() { yaml_parser_delete(&p); }
};

struct Event {
  yaml_event_t e;
  bool live = false;
  ~Event() {
    if (live) yaml_event_delete(&e);
  }
};

struct Anchored {
  YamlNode node;
  size_t count = 0;   // nodes in it
  size_t height = 0;  // 0 for a scalar
};

// An open sequence or mapping.
struct Frame {
  YamlNode node;
  std::string anchor;
  size_t count = 1, height = 1;
  bool have_key = false;  // a mapping's key is read, its value is next
  std::string key;
  std::unordered_map<std::string, size_t> index;  // a mapping's keys -> place
};

class Builder {
 public:
  explicit Builder(std::string origin) : origin_(std::move(origin)) {}

  YamlNode run(const std::string& text) {
    Parser parser;
    yaml_parser_set_input_string(&parser.p, reinterpret_cast<const unsigned char*>(text.data()),
                                 text.size());
    size_t documents = 0;
    for (;;) {
      Event ev;
      if (!yaml_parser_parse(&parser.p, &ev.e)) {
        size_t line = parser.p.problem_mark.line + 1, col = parser.p.problem_mark.column + 1;
        std::string what = parser.p.problem ? parser.p.problem : "malformed YAML";
        if (parser.p.error == YAML_READER_ERROR) {  // a byte offset, not a mark
          const size_t at = std::min(parser.p.problem_offset, text.size());
          line = 1 + static_cast<size_t>(std::count(
                         text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
          const size_t nl = text.rfind('\n', at == 0 ? 0 : at - 1);
          col = nl == std::string::npos || at == 0 ? at + 1 : at - nl;
          what +=
              " (YAML allows printable Unicode only; write other characters as \\u escapes in "
              "double quotes)";
        }
        if (parser.p.context) what = std::string(parser.p.context) + ": " + what;
        fail(line, col, "not valid YAML: " + what);
      }
      ev.live = true;
      const yaml_event_t& e = ev.e;
      const size_t line = e.start_mark.line + 1, col = e.start_mark.column + 1;
      switch (e.type) {
        case YAML_STREAM_END_EVENT: return root_ ? std::move(*root_) : YamlNode{};
        case YAML_DOCUMENT_START_EVENT:
          if (++documents > 1)
            fail(line, col, "a second YAML document (a training file is one document)");
          break;
        case YAML_SCALAR_EVENT: {
          YamlNode n;
          n.kind = YamlNode::Kind::kScalar;
          n.text.assign(reinterpret_cast<const char*>(e.data.scalar.value), e.data.scalar.length);
          n.plain = e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
          n.line = line;
          n.column = col;
          if (const char* t = reinterpret_cast<const char*>(e.data.scalar.tag)) {
            check_tag(t, line, col, false);
            if (std::string(t) == "tag:yaml.org,2002:str") n.plain = false;
          }
          std::string anchor =
              e.data.scalar.anchor ? reinterpret_cast<const char*>(e.data.scalar.anchor) : "";
          count(1, line, col);
          if (!anchor.empty()) anchors_[anchor] = std::make_shared<Anchored>(Anchored{n, 1, 0});
          add(std::move(n), 1, 0, line, col);
          break;
        }
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
          const bool seq = e.type == YAML_SEQUENCE_START_EVENT;
          const auto* tag = seq ? e.data.sequence_start.tag : e.data.mapping_start.tag;
          const auto* anchor = seq ? e.data.sequence_start.anchor : e.data.mapping_start.anchor;
          if (tag) check_tag(reinterpret_cast<const char*>(tag), line, col, true);
          if (!open_.empty() && open_.back().node.kind == YamlNode::Kind::kMap &&
              !open_.back().have_key)
            fail(line, col,
                 "a mapping key that is a " + std::string(seq ? "sequence" : "mapping") +
                     " (keys are scalars)");
          if (open_.size() + 1 > kMaxYamlDepth)
            fail(line, col,
                 "YAML nested deeper than " + std::to_string(kMaxYamlDepth) +
                     " levels (sequences and mappings); ciuic reads at most " +
                     std::to_string(kMaxYamlDepth));
          count(1, line, col);
          Frame f;
          f.node.kind = seq ? YamlNode::Kind::kSeq : YamlNode::Kind::kMap;
          f.node.line = line;
          f.node.column = col;
          if (anchor) f.anchor = reinterpret_cast<const char*>(anchor);
          open_.push_back(std::move(f));
          break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: {
          Frame f = std::move(open_.back());
          open_.pop_back();
          if (f.node.kind == YamlNode::Kind::kMap) merge_keys(f);
          if (!f.anchor.empty())
            anchors_[f.anchor] = std::make_shared<Anchored>(Anchored{f.node, f.count, f.height});
          add(std::move(f.node), f.count, f.height, f.node.line, f.node.column);
          break;
        }
        case YAML_ALIAS_EVENT: {
          const std::string name = reinterpret_cast<const char*>(e.data.alias.anchor);
          auto it = anchors_.find(name);
          if (it == anchors_.end())
            fail(line, col, "alias *" + name + " names no anchor defined before it");
          const std::shared_ptr<Anchored> a = it->second;  // kept alive if the anchor is redefined
          if (open_.size() + a->height > kMaxYamlDepth)
            fail(line, col,
                 "alias *" + name + " nests deeper than " + std::to_string(kMaxYamlDepth) +
                     " levels");
          count(a->count, line, col, "alias *" + name);
          add(YamlNode(a->node), a->count, a->height, line, col);
          break;
        }
        default: break;
      }
    }
  }

 private:
  [[noreturn]] void fail(size_t line, size_t col, const std::string& what) const {
    throw UsageError(origin_ + ": line " + std::to_string(line) + ", column " +
                     std::to_string(col) + ": " + printable_text(what, false));
  }

  void check_tag(const std::string& tag, size_t line, size_t col, bool container) const {
    static const char* kCore = "tag:yaml.org,2002:";
    if (tag == "!") return;  // non-specific
    if (tag.rfind(kCore, 0) == 0) {
      const std::string t = tag.substr(std::string(kCore).size());
      for (const char* ok : {"str", "int", "float", "bool", "null", "seq", "map"})
        if (t == ok) return;
    }
    fail(line, col,
         std::string("the tag ") + tag + " on a " + (container ? "collection" : "scalar") +
             " is not one of YAML's core tags (ciuic reads plain data, as safe_load does)");
  }

  void count(size_t n, size_t line, size_t col, const std::string& what = "") {
    nodes_ += n;
    if (nodes_ > kMaxYamlNodes)
      fail(line, col,
           (what.empty() ? std::string("the document") : what + " expands the document to") +
               " more than " + std::to_string(kMaxYamlNodes) +
               " nodes (an alias bomb?); ciuic reads at most that many");
  }

  void add(YamlNode&& n, size_t cnt, size_t height, size_t line, size_t col) {
    if (open_.empty()) {
      root_ = std::move(n);
      return;
    }
    Frame& f = open_.back();
    f.count += cnt;
    f.height = std::max(f.height, height + 1);
    if (f.node.kind == YamlNode::Kind::kSeq) {
      f.node.items.push_back(std::move(n));
      return;
    }
    if (!f.have_key) {
      if (n.kind != YamlNode::Kind::kScalar) fail(line, col, "a mapping key that is not a scalar");
      f.key = n.text;
      f.have_key = true;
      return;
    }
    f.have_key = false;
    auto [at, inserted] = f.index.try_emplace(f.key, f.node.map.size());
    if (inserted)
      f.node.map.push_back(YamlEntry{f.key, std::move(n)});
    else
      f.node.map[at->second].second = std::move(n);
  }

  // `<<: {..}` or `<<: [{..}, ..]`: the keys of the merged mappings that the mapping does not write
  // itself, the first listed mapping first (PyYAML's precedence).
  void merge_keys(Frame& f) {
    auto it = f.index.find("<<");
    if (it == f.index.end()) return;
    YamlNode merged = std::move(f.node.map[it->second].second);
    f.node.map.erase(f.node.map.begin() + static_cast<std::ptrdiff_t>(it->second));
    f.index.clear();
    for (size_t i = 0; i < f.node.map.size(); ++i) f.index.emplace(f.node.map[i].first, i);
    std::vector<const YamlNode*> sources;
    if (merged.kind == YamlNode::Kind::kMap)
      sources.push_back(&merged);
    else if (merged.kind == YamlNode::Kind::kSeq)
      for (const auto& s : merged.items) sources.push_back(&s);
    for (const YamlNode* s : sources) {
      if (s->kind != YamlNode::Kind::kMap)
        fail(s->line, s->column, "a merge key (<<) takes mappings");
      for (const auto& [k, v] : s->map)
        if (f.index.emplace(k, f.node.map.size()).second) f.node.map.push_back(YamlEntry{k, v});
    }
  }

  std::string origin_;
  std::vector<Frame> open_;
  std::optional<YamlNode> root_;
  std::unordered_map<std::string, std::shared_ptr<Anchored>> anchors_;
  size_t nodes_ = 0;
};

}  // namespace

YamlNode parse_yaml(const std::string& text, const std::string& origin) {
  Builder b(printable_text(origin, false));
  return b.run(text);
}

}  // namespace ciuic::importer
