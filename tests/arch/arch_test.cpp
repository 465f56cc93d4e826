// The architecture's rules, checked on the source tree (docs/architecture.md, "Layers"):
//   * the engine names no plugin outside the one table of default plugins, the table of export
//     dtype names (dtype names, not the precision plugins) and the importers of core/src/import/
//     (kMayNamePlugins says why for each);
//   * plugins and the out-of-tree examples include only the SDK (<ciuic/...>, the kits) and
//     their own files: no engine header, no other plugin's files;
//   * the kits' headers declare only in ciuic::kit (the conformance kit's in ciuic::conformance),
//     never in the SDK's `ciuic`, and no SDK header opens their namespace or includes them;
//   * recipe/ does not include registry/ (the registry depends on the recipe, not both ways);
//   * the Jinja engine (jinja/) is a leaf: it includes only its own headers, <ciuic/error.h> and
//     <ciuic/export.h>, the standard library and nlohmann/json; no LibTorch, no other engine
//     folder;
//   * the text metrics (score/) are a leaf: only their own headers, <ciuic/export.h> and the
//     standard library; no LibTorch, no other engine folder, no JSON;
//   * plan/ does not include train/ (the trainer calls the planner, not both ways);
//   * the report formats (report/: metrics.jsonl, TensorBoard, the HTML report, per-rank records,
//     the --watch view) are a leaf below the trainer: they include only their own headers, a few
//     SDK helpers, the standard library and nlohmann/json — no LibTorch, no train/ or other
//     engine folder — so a tool reads a run's records without the engine;
//   * every JSON parse is preceded, in its function, by the depth check of ciuic/json.h;
//   * the training loop fits on a screen;
//   * the umbrella header ciuic/ciuic.h includes every SDK header.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = CIUIC_SOURCE_DIR;

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<fs::path> sources(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const auto ext = e.path().extension();
    if (e.is_regular_file() && (ext == ".cpp" || ext == ".h" || ext == ".in"))
      out.push_back(e.path());
  }
  return out;
}

// Lines [first, last] of `file` between the line containing `open` and the next line "};".
bool inside_table(const std::vector<std::string>& lines, size_t at, const std::string& open) {
  for (size_t i = at + 1; i-- > 0;) {
    if (lines[i].find(open) != std::string::npos) return true;
    if (i != at && lines[i].find("};") != std::string::npos) return false;
  }
  return false;
}

// `text` with comments, string and character literals blanked (spaces; newlines kept), so braces
// and names are the code's own. Raw strings R"d(...)d" included.
std::string code_only(const std::string& text) {
  std::string out = text;
  size_t i = 0;
  const size_t n = text.size();
  auto blank = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < n; ++k)
      if (out[k] != '\n') out[k] = ' ';
  };
  while (i < n) {
    const char c = text[i];
    if (c == '/' && i + 1 < n && text[i + 1] == '/') {
      const size_t e = text.find('\n', i);
      blank(i, e == std::string::npos ? n : e);
      i = e == std::string::npos ? n : e;
    } else if (c == '/' && i + 1 < n && text[i + 1] == '*') {
      const size_t e = text.find("*/", i + 2);
      const size_t end = e == std::string::npos ? n : e + 2;
      blank(i, end);
      i = end;
    } else if (c == 'R' && i + 1 < n && text[i + 1] == '"' &&
               (i == 0 ||
                !(std::isalnum(static_cast<unsigned char>(text[i - 1])) || text[i - 1] == '_'))) {
      const size_t open = text.find('(', i + 2);
      if (open == std::string::npos) break;
      const std::string close = ")" + text.substr(i + 2, open - i - 2) + "\"";
      const size_t e = text.find(close, open);
      const size_t end = e == std::string::npos ? n : e + close.size();
      blank(i, end);
      i = end;
    } else if (c == '"' || c == '\'') {
      size_t k = i + 1;
      while (k < n && text[k] != c && text[k] != '\n') k += text[k] == '\\' ? 2 : 1;
      blank(i, k + 1);
      i = k + 1;
    } else {
      ++i;
    }
  }
  return out;
}

// The offset where the function enclosing offset `pos` of `code` (code_only's output) begins — its
// head: the code after the previous ';', '{' or '}' before its body's '{' (so a constructor's
// initializer list counts) — or npos outside every function. A brace opens a function body when the
// code before it (back to the previous ';', '{' or '}') ends with ')' — a parameter list, maybe
// followed by const/noexcept/override/final or a trailing return type — and is no if/for/while/
// switch/catch; a lambda's body belongs to the function that defines it.
size_t enclosing_function(const std::string& code, size_t pos) {
  static const std::regex function_head(
      "\\)\\s*((const|noexcept|override|final|mutable)\\s*)*(->[^;{}]*)?$");
  static const std::regex control("^\\s*(else\\s+)?(if|for|while|switch|catch)\\b");
  static const std::regex lambda("\\]\\s*(\\([^;{}]*\\))?\\s*(mutable\\s*)?(->[^;{}]*)?$");
  struct Open {
    size_t head;  // where the code before the '{' begins
    bool function;
  };
  std::vector<Open> open;
  for (size_t i = 0; i < pos && i < code.size(); ++i) {
    if (code[i] == '{') {
      size_t h = i;
      while (h > 0 && code[h - 1] != ';' && code[h - 1] != '{' && code[h - 1] != '}') --h;
      const std::string head = code.substr(h, i - h);
      const bool fn = std::regex_search(head, function_head) && !std::regex_search(head, control) &&
                      !std::regex_search(head, lambda);
      open.push_back({h, fn});
    } else if (code[i] == '}' && !open.empty()) {
      open.pop_back();
    }
  }
  for (auto it = open.rbegin(); it != open.rend(); ++it)
    if (it->function) return it->head;
  return std::string::npos;
}
}  // namespace

// Where the engine may name a plugin, and why; `table` limits a file to the lines of one table, a
// `path` ending in '/' is a whole folder. Everywhere else in core/ — recipe/ included, but for its
// one table — no plugin is named.
struct MayNamePlugins {
  const char* path;
  const char* table;  // "" = anywhere in it
  const char* why;
};
const MayNamePlugins kMayNamePlugins[] = {
    {"core/src/recipe/recipe.cpp", "kDefaultPlugins[] = {", "the one table of default plugins"},
    {"core/src/model/hf_export.cpp",
     "kExportDtypes[] =", "\"bf16\"/\"fp32\" there are dtype names, not the precision plugins"},
    {"core/src/import/", "",
     "importers translate another tool's vocabulary (DeepSpeed's fp16/bf16 sections, ZeRO stages, "
     "offload) into "
     "the recipe text of the plugins that implement it"},
    {"core/conformance/", "",
     "the conformance kit is no part of the engine: it drives a plugin under test with an "
     "installed helper plugin "
     "(the optimizer check's fp32 precision)"},
};

TEST(Architecture, TheEngineNamesNoPluginOutsideTheDefaultsTable) {
  const std::regex name(
      "\"(zero1|zero2|zero3|ddp|cpu_adam|adamw|lion|bf16|fp16|fp32|nccl|gloo|synthetic|cached_ssd)"
      "\"");
  std::vector<std::string> found;
  for (const fs::path& p : sources(kRoot / "core")) {
    const auto lines = lines_of(p);
    const std::string rel = fs::relative(p, kRoot).string();
    for (size_t i = 0; i < lines.size(); ++i) {
      if (!std::regex_search(lines[i], name)) continue;
      bool allowed = false;
      for (const MayNamePlugins& m : kMayNamePlugins) {
        const std::string path = m.path;
        const bool here = path.back() == '/' ? rel.rfind(path, 0) == 0 : rel == path;
        allowed = allowed || (here && (*m.table == 0 || inside_table(lines, i, m.table)));
      }
      if (!allowed) found.push_back(rel + ":" + std::to_string(i + 1) + ": " + lines[i]);
    }
  }
  std::string all;
  for (const auto& f : found) all += f + "\n";
  EXPECT_TRUE(found.empty()) << "the engine names plugins outside the places of kMayNamePlugins:\n"
                             << all;
  // Each place still exists (a moved file must take its rule along, not leave it behind).
  for (const MayNamePlugins& m : kMayNamePlugins)
    EXPECT_TRUE(fs::exists(kRoot / m.path)) << m.path << ": " << m.why;
}

TEST(Architecture, PluginsIncludeOnlyTheSdkAndTheirOwnFiles) {
  const std::regex quoted("^\\s*#\\s*include\\s*\"([^\"]+)\"");
  const std::regex angled("^\\s*#\\s*include\\s*<ciuic/([^>]+)>");
  std::vector<std::string> bad;
  for (const fs::path& top : {kRoot / "plugins", kRoot / "examples"}) {
    for (const fs::path& p : sources(top)) {
      const auto lines = lines_of(p);
      for (size_t i = 0; i < lines.size(); ++i) {
        std::smatch m;
        const std::string where = fs::relative(p, kRoot).string() + ":" + std::to_string(i + 1);
        if (std::regex_search(lines[i], m, quoted)) {
          // Own files: next to the source (or in its folder tree), never above the plugin's
          // folder, never the engine's.
          const std::string inc = m[1];
          if (inc.find("..") != std::string::npos && inc.rfind("../common/", 0) != 0)
            bad.push_back(where + ": " + inc + " leaves the plugin's folder");
          for (const char* engine :
               {"recipe/", "registry/", "train/", "model/", "launch/", "tokenizer/", "jinja/",
                "checkpoint/", "plan/", "app/", "base/", "sdk/", "schedule/", "score/"})
            if (inc.rfind(engine, 0) == 0)
              bad.push_back(where + ": " + inc + " is an engine header");
        }
        if (std::regex_search(lines[i], m, angled)) {
          const fs::path h = std::string(m[1]);
          const bool sdk = fs::exists(kRoot / "core/include/ciuic" / h) ||
                           (h.filename() == "version.h" && h.parent_path().empty());
          const bool kit = h.parent_path() == "kit";
          if (!sdk && !kit)
            bad.push_back(where + ": <ciuic/" + h.string() + "> is not an SDK header");
        }
      }
    }
  }
  std::string all;
  for (const auto& b : bad) all += b + "\n";
  EXPECT_TRUE(bad.empty()) << all;
}

// What a header declares outside the namespace `ns` (e.g. "ciuic::kit"): every construct at file
// scope — outside every namespace block — other than `namespace ns {` or `namespace ns::inner {`,
// as "line N: text". Comments, string and character literals and preprocessor lines do not
// count; a forward declaration of an SDK type (`namespace ciuic { class Config; }`) does (include
// the SDK header instead), and so does the pre-C++17 spelling `namespace ciuic { namespace kit {`.
std::vector<std::string> declared_outside(std::string s, const std::string& ns) {
  // Blank comments, literals and directives, keeping the line breaks.
  const auto blank = [&](size_t from, size_t to) {
    for (size_t k = from; k < std::min(to, s.size()); ++k)
      if (s[k] != '\n') s[k] = ' ';
  };
  bool line_start = true;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    size_t end = i;
    if (s.compare(i, 2, "//") == 0) {
      end = s.find('\n', i);
    } else if (s.compare(i, 2, "/*") == 0) {
      end = s.find("*/", i + 2);
      end = end == std::string::npos ? s.size() : end + 2;
    } else if (c == '#' && line_start) {
      for (end = i; end < s.size() && !(s[end] == '\n' && s[end - 1] != '\\');) ++end;
    } else if (c == '"' ||
               (c == '\'' && (i == 0 || !(std::isalnum(static_cast<unsigned char>(s[i - 1])) ||
                                          s[i - 1] == '_')))) {  // not 1'000
      for (end = i + 1; end < s.size() && s[end] != c; ++end)
        if (s[end] == '\\') ++end;
      ++end;
    }
    if (end != i) {
      blank(i, end);
      i = std::min(end, s.size()) - 1;
      continue;
    }
    if (c == '\n')
      line_start = true;
    else if (!std::isspace(static_cast<unsigned char>(c)))
      line_start = false;
  }
  const std::regex opens_ns("namespace " + ns + "(::\\w+)*");
  std::vector<std::string> out;
  int depth = 0;
  size_t line = 1, start = std::string::npos, start_line = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n') ++line;
    if (depth > 0) {
      depth += c == '{' ? 1 : c == '}' ? -1 : 0;
      continue;
    }
    if (start == std::string::npos && !std::isspace(static_cast<unsigned char>(c)))
      start = i, start_line = line;
    if (start == std::string::npos || (c != '{' && c != ';' && c != '}')) continue;
    std::string text = std::regex_replace(s.substr(start, i - start), std::regex("\\s+"), " ");
    if (!text.empty() && text.back() == ' ') text.pop_back();
    start = std::string::npos;
    if (c == '{') depth = 1;  // a kit namespace, or a block outside it (reported once, skipped)
    if (c == '{' && std::regex_match(text, opens_ns)) continue;
    if (!text.empty() || c != ';')
      out.push_back("line " + std::to_string(start_line) + ": " + text +
                    (c == '{' ? " {" : std::string(1, c)));
  }
  return out;
}

// The kits (static libraries plugins link; headers <ciuic/kit/...>) are one namespace, ciuic::kit,
// and the conformance kit (<ciuic/testing/...>, linked by test programs) is ciuic::conformance;
// neither is the SDK's `ciuic`, whose headers are the versioned ABI (docs/plugins.md, "ABI"). A
// kit header declares nothing outside ciuic::kit — no forward declaration of an SDK type, no
// helper in `ciuic` —, and no SDK header opens a kit's namespace or includes a kit header.
TEST(Architecture, TheKitsAreOneNamespaceApartFromTheAbi) {
  // The scanner itself, on what it must refuse and accept.
  EXPECT_EQ(declared_outside(
                "namespace ciuic {\nclass Config;\n}\nnamespace ciuic::kit {\nclass A {};\n}\n",
                "ciuic::kit"),
            std::vector<std::string>{"line 1: namespace ciuic {"});
  EXPECT_EQ(
      declared_outside("// namespace ciuic {\n#include <x> // {\nnamespace ciuic::kit::cuda {\n"
                       "const char* s = \"}\"; int n = 1'000; char c = '}';\n}  // namespace\n",
                       "ciuic::kit"),
      std::vector<std::string>{});
  EXPECT_EQ(
      declared_outside("namespace ciuic::kit {}\nusing ciuic::kit::A;\nnamespace { int x; }\n",
                       "ciuic::kit"),
      (std::vector<std::string>{"line 2: using ciuic::kit::A;", "line 3: namespace {"}));
  EXPECT_EQ(declared_outside("namespace ciuic::kitchen {}\n", "ciuic::kit"),
            std::vector<std::string>{"line 1: namespace ciuic::kitchen {"});

  const auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::string all;
  size_t kit_headers = 0;
  for (const fs::path& p : sources(kRoot / "plugins")) {
    const std::string rel = fs::relative(p, kRoot).string();
    if (rel.find("/include/ciuic/kit/") == std::string::npos) continue;
    ++kit_headers;
    for (const auto& d : declared_outside(read(p), "ciuic::kit")) all += rel + ": " + d + "\n";
  }
  for (const fs::path& p : sources(kRoot / "core/conformance/include"))
    for (const auto& d : declared_outside(read(p), "ciuic::conformance"))
      all += fs::relative(p, kRoot).string() + ": " + d + "\n";
  EXPECT_TRUE(all.empty())
      << "declared outside the kit's namespace (ciuic::kit; the conformance kit's: "
         "ciuic::conformance):\n"
      << all;
  EXPECT_GE(kit_headers, 10u)
      << "the kits' headers (plugins/*/kit/include/ciuic/kit/) were not found";

  const std::regex kit_in_sdk(
      "^\\s*(namespace\\s+(ciuic::)?(kit|conformance)\\b|#\\s*include\\s*<ciuic/(kit|testing)/)");
  for (const fs::path& p : sources(kRoot / "core/include/ciuic")) {
    const auto lines = lines_of(p);
    for (size_t i = 0; i < lines.size(); ++i)
      EXPECT_FALSE(std::regex_search(lines[i], kit_in_sdk))
          << fs::relative(p, kRoot).string() << ":" << i + 1 << ": " << lines[i]
          << " (the SDK is the ABI; the kits sit outside it)";
  }
}

TEST(Architecture, RecipeDoesNotIncludeRegistry) {
  const std::regex include_registry("^\\s*#\\s*include\\s*[\"<][^\">]*registry/");
  for (const fs::path& p : sources(kRoot / "core/src/recipe"))
    for (const auto& l : lines_of(p))
      EXPECT_FALSE(std::regex_search(l, include_registry)) << p << ": " << l;
}

// Checks that every file of the engine folder `folder` includes only its own headers
// ("<folder>/..."), the standard library (names without '/' or '.') and the angled headers in
// `allowed`; returns how many files it read.
size_t expect_leaf(const std::string& folder, const std::vector<std::string>& allowed) {
  const std::regex include("^\\s*#\\s*include\\s*([\"<])([^\">]+)[\">]");
  size_t files = 0;
  for (const fs::path& p : sources(kRoot / "core/src" / folder)) {
    ++files;
    const auto lines = lines_of(p);
    for (size_t i = 0; i < lines.size(); ++i) {
      std::smatch m;
      if (!std::regex_search(lines[i], m, include)) continue;
      const std::string inc = m[2];
      const bool ok =
          m[1] == "\""
              ? inc.rfind(folder + "/", 0) == 0
              : (std::find(allowed.begin(), allowed.end(), inc) != allowed.end() ||
                 (inc.find('/') == std::string::npos && inc.find('.') == std::string::npos));
      EXPECT_TRUE(ok) << fs::relative(p, kRoot).string() << ":" << i + 1 << ": " << lines[i];
    }
  }
  return files;
}

TEST(Architecture, TheJinjaEngineIsALeafWithoutLibTorch) {
  EXPECT_GE(
      expect_leaf("jinja", {"ciuic/error.h", "ciuic/export.h", "nlohmann/json.hpp", "string.h"}),
      10u);
}

// The report formats are written by the trainer and read by tools (--plot, --watch); they know
// records and files, not the loop, the devices or the plugins.
TEST(Architecture, TheReportFormatsAreALeafBelowTheTrainer) {
  EXPECT_GE(expect_leaf("report", {"ciuic/error.h", "ciuic/export.h", "ciuic/json.h", "ciuic/log.h",
                                   "ciuic/checksum.h", "nlohmann/json.hpp", "unistd.h"}),
            10u);
  // And the loop's folder keeps no report format of its own.
  for (const char* moved : {"metrics.h", "tensorboard.h", "html_report.h"})
    EXPECT_FALSE(fs::exists(kRoot / "core/src/train" / moved))
        << "core/src/train/" << moved << " belongs in core/src/report";
}

// BLEU, ROUGE-L and percentiles (core/src/score/) are plain C++: the standard library and their own
// headers (<ciuic/export.h> is CIUIC_API, a macro). A LibTorch or engine include would tie the
// metrics to the trainer.
TEST(Architecture, TheTextMetricsAreALeafWithoutLibTorch) {
  EXPECT_GE(expect_leaf("score", {"ciuic/export.h"}), 6u);
}

// The trainer calls the planner (micro_batch_size = "auto", planned options); what both read from
// the recipe is in plan/recipe_inputs.h. A train/ include in plan/ would make the two one unit.
TEST(Architecture, PlanDoesNotIncludeTrain) {
  const std::regex include_train("^\\s*#\\s*include\\s*[\"<][^\">]*train/");
  for (const fs::path& p : sources(kRoot / "core/src/plan"))
    for (const auto& l : lines_of(p))
      EXPECT_FALSE(std::regex_search(l, include_train)) << p << ": " << l;
}

// Issue 27: every JSON text is checked against ciuic/json.h's depth bound before nlohmann builds a
// value from it, so nothing recursive meets a 100,000-deep nest. Each parse (json::parse,
// sax_parse) is preceded by the check in the same function (its lambdas included): a check
// elsewhere in the file does not count (a file-wide rule let an unbounded parse in lora.cpp pass
// because another function of the file checked). The exceptions say why they need none.
TEST(Architecture, EveryJsonParseChecksTheDepthFirst) {
  const std::regex parse("\\b(json::parse|sax_parse)\\s*\\(");
  const std::regex check("\\b(check_json_depth|json_depth_problem)\\s*\\(");
  const std::map<std::string, std::string> exempt = {
      // It parses HfTokenizer::config_text(), which the tokenizer checked when it was built.
      {"core/src/tokenizer/hf_chat_template.cpp", "tokenizer_config.json, checked by HfTokenizer"},
  };
  std::vector<std::string> bad;
  size_t parses = 0;
  for (const fs::path& top : {kRoot / "core", kRoot / "plugins"})
    for (const fs::path& p : sources(top)) {
      const std::string rel = fs::relative(p, kRoot).string();
      if (exempt.count(rel)) continue;
      std::ifstream in(p);
      const std::string code = code_only(
          std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
      for (auto it = std::sregex_iterator(code.begin(), code.end(), parse);
           it != std::sregex_iterator(); ++it) {
        ++parses;
        const size_t at = static_cast<size_t>(it->position());
        const size_t body = enclosing_function(code, at);
        const std::string before = code.substr(body == std::string::npos ? at : body,
                                               body == std::string::npos ? 0 : at - body);
        if (!std::regex_search(before, check)) {
          const size_t line =
              static_cast<size_t>(std::count(code.begin(), code.begin() + at, '\n')) + 1;
          bad.push_back(rel + ":" + std::to_string(line));
        }
      }
    }
  EXPECT_GE(parses, 20u);  // the scan finds the parses it is about
  std::string all;
  for (const auto& b : bad) all += b + "\n";
  EXPECT_TRUE(bad.empty())
      << "these JSON parses have no ciuic::check_json_depth (ciuic/json.h) before them in their "
         "function:\n"
      << all;
}

// The scanner above on code written to fool it: a check in another function, in a comment or a
// string does not count; one in the same function (through a lambda, a try block or a
// constructor's initializer list) does.
TEST(Architecture, TheJsonDepthRuleSeesFunctionsNotFiles) {
  const std::regex check("\\b(check_json_depth|json_depth_problem)\\s*\\(");
  auto checked = [&](const std::string& text) {
    const std::string code = code_only(text);
    const size_t at = code.find("json::parse(");
    const size_t body = enclosing_function(code, at);
    return body != std::string::npos && std::regex_search(code.substr(body, at - body), check);
  };
  EXPECT_FALSE(
      checked("void a(const std::string& t) { check_json_depth(t, \"a\"); }\n"
              "json b(const std::string& t) { return json::parse(t); }\n"));
  EXPECT_FALSE(
      checked("json b(const std::string& t) {\n  // check_json_depth(t, \"b\");\n"
              "  return json::parse(t);\n}\n"));
  EXPECT_FALSE(
      checked("json b(const std::string& t) {\n  log(\"check_json_depth(t)\");\n"
              "  return json::parse(t);\n}\n"));
  EXPECT_FALSE(
      checked("json b(const std::string& t) {\n  return json::parse(t);\n}\n"
              "void c(const std::string& t) { check_json_depth(t, \"c\"); }\n"));
  EXPECT_TRUE(
      checked("json b(const std::string& t,\n       int x) const {\n"
              "  check_json_depth(t, \"b\");\n  if (x) {\n    try {\n"
              "      auto f = [&](int) { return json::parse(t); };\n"
              "    } catch (const std::exception& e) {}\n  }\n}\n"));
  EXPECT_TRUE(
      checked("Reader::Reader(const std::string& t) : a_(1), b_(check_json_depth(t, \"r\")) {\n"
              "  j_ = json::parse(t);\n}\n"));
}

TEST(Architecture, TheTrainingLoopFitsOnAScreen) {
  const auto lines = lines_of(kRoot / "core/src/train/trainer.cpp");
  size_t begin = 0, end = 0;
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].rfind("int train(", 0) == 0) begin = i;
  for (size_t i = begin; i < lines.size(); ++i)
    if (lines[i] == "}") {
      end = i;
      break;
    }
  ASSERT_GT(begin, 0u) << "no `int train(` in trainer.cpp";
  EXPECT_LE(end - begin + 1, 80u) << "train() is " << end - begin + 1 << " lines";
  // No string-keyed recipe reads in the trainer: options are typed and read once (options.h).
  for (const char* f : {"trainer.cpp", "run.cpp", "report.cpp", "evaluate.cpp", "checkpoints.cpp"})
    for (const auto& l : lines_of(kRoot / "core/src/train" / f))
      EXPECT_EQ(l.find(".get_"), std::string::npos) << f << ": " << l;
}

// Plugins read their options typed (ciuic::Option<T>, Config::get(option): the key written once,
// the type read the type declared, the default and range checked even on a Config made without the
// schema), never by string key. The places still reading by key, each with its reason:
struct KeyedReadsLeft {
  const char* path;
  const char* why;
};
// None left (the kit's BucketSharding::options_from reads its strategies' typed declarations since
// issue 28's last step); an entry names a file and why it still reads by key.
const KeyedReadsLeft kKeyedReadsLeft[] = {{"", ""}};
TEST(Architecture, PluginsReadTheirOptionsTyped) {
  const std::regex keyed("\\.get_(bool|int|float|string|string_list|float_list)\\(\"");
  std::string all;
  for (const char* dir : {"plugins", "examples"})
    for (const fs::path& p : sources(kRoot / dir)) {
      const std::string rel = fs::relative(p, kRoot).string();
      bool left = false;
      for (const KeyedReadsLeft& k : kKeyedReadsLeft) left = left || (*k.path && rel == k.path);
      if (left) continue;
      const auto lines = lines_of(p);
      for (size_t i = 0; i < lines.size(); ++i)
        if (std::regex_search(lines[i], keyed))
          all += rel + ":" + std::to_string(i + 1) + ": " + lines[i] + "\n";
    }
  EXPECT_TRUE(all.empty())
      << "string-keyed option reads (declare a ciuic::Option<T> and read cfg.get(option)):\n"
      << all;
  for (const KeyedReadsLeft& k : kKeyedReadsLeft)
    if (*k.path) EXPECT_TRUE(fs::exists(kRoot / k.path)) << k.path << ": " << k.why;
}

// ciuic/ciuic.h is "the whole SDK in one include": every header of core/include/ciuic, and nothing
// that is not there (it once named ciuic/offload.h and ciuic/optim.h, which no longer existed).
TEST(Architecture, TheUmbrellaHeaderIncludesTheWholeSdk) {
  const fs::path dir = kRoot / "core/include/ciuic";
  const std::regex angled("^\\s*#\\s*include\\s*<ciuic/([^>]+)>");
  std::vector<std::string> included;
  for (const auto& l : lines_of(dir / "ciuic.h")) {
    std::smatch m;
    if (std::regex_search(l, m, angled)) included.push_back(m[1]);
  }
  for (const auto& h : included)
    EXPECT_TRUE(fs::exists(dir / h) || h == "version.h")
        << "ciuic.h includes <ciuic/" << h << ">, which is no SDK header";
  EXPECT_NE(std::find(included.begin(), included.end(), "version.h"), included.end())
      << "ciuic.h lacks <ciuic/version.h>";
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".h" || name == "ciuic.h") continue;
    EXPECT_NE(std::find(included.begin(), included.end(), name), included.end())
        << "ciuic.h does not include <ciuic/" << name << ">";
  }
}
