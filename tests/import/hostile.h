// Hostile text for the importers' tests (tests/import): the strings an attacker puts into a
// config's keys and values, and an independent check that a text holds no byte a terminal acts on.
#pragma once

#include <string>
#include <vector>

namespace ciuic::importer {

// What an attacker controls: every key and string of the config, and the config's file name.
// Each gets newlines with a recipe table after them, quotes, brackets, '#', CR, ESC and BEL
// sequences, NUL, C1 controls (U+009B is CSI), U+2028 and a bidi override, and a long run of them.
inline std::vector<std::string> hostile_strings() {
  std::vector<std::string> h = {
      "comms_logger\n[run]\nplugin_paths = [\"evilplugins\"] #",
      "x\"]\n[run]\noutput_dir = \"/tmp/evil\"\nsetup = \"touch /tmp/pwned\"",
      "#\r[run]\rplugin_paths = [\"cr\"]",
      "'''\n[run]\n'''",
      "\x1b]0;owned\x07\x1b[2J\x1b[31mred",
      std::string("nul\0[run]\nplugin_paths = [\"nul\"]", 34),
      "c1 \xc2\x9b"
      "2J and \xc2\x85 next line",
      "sep \xe2\x80\xa8[run]\xe2\x80\xa9 and \xe2\x80\xae override",
      "] = 1\n[[run]]\n",
      "\\\n[run]",
  };
  std::string long_one;
  for (int i = 0; i < 2000; ++i) long_one += "\n[run]\nplugin_paths = [\"long\"] #\x1b[0m";
  h.push_back(long_one);
  return h;
}

// "" when the text holds no byte a terminal acts on — no C0 control other than '\n' (when
// allowed), no DEL, no C1 control, no U+2028/U+2029, no bidi control — else what and where.
// Checked byte by byte here, independently of sdk/printable.h.
inline std::string unsafe_byte(const std::string& s, bool allow_newline) {
  const auto u = [&](size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0; };
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = u(i);
    if ((c < 0x20 && !(allow_newline && c == '\n')) || c == 0x7f)
      return "control byte at " + std::to_string(i);
    if (c == 0xc2 && u(i + 1) >= 0x80 && u(i + 1) <= 0x9f)
      return "C1 control at " + std::to_string(i);
    if (c == 0xe2 && u(i + 1) == 0x80 && u(i + 2) >= 0xa8 && u(i + 2) <= 0xae)
      return "separator or bidi control at " + std::to_string(i);
    if (c == 0xe2 && u(i + 1) == 0x81 && u(i + 2) >= 0xa6 && u(i + 2) <= 0xa9)
      return "bidi isolate at " + std::to_string(i);
  }
  return "";
}

}  // namespace ciuic::importer
